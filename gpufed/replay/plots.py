"""PNG plots of a replay: utilisation over time, queueing-delay CDF, team share vs guarantee.

matplotlib is an optional dependency (`pip install gpufed[replay]`); it is imported only here,
with the non-interactive Agg backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpufed.replay import metrics
from gpufed.replay.runner import ReplayRun

_DAY = 86400.0


class PlotError(RuntimeError):
    """Plots cannot be drawn (matplotlib is missing)."""


def write_plots(run: ReplayRun, report: dict[str, Any], out: Path) -> list[Path]:
    """Draw the three plots into `out`; returns their paths."""
    plt = _pyplot()
    out.mkdir(parents=True, exist_ok=True)
    title = f"{report['scheduler']} scheduler, burst {report['burst']}"
    paths = [
        _utilization(plt, run, report, out / "utilization.png", title),
        _wait_cdf(plt, run, out / "queueing_delay_cdf.png", title),
        _team_shares(plt, report, out / "team_share.png", title),
    ]
    return paths


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise PlotError(
            "plots need matplotlib: pip install 'gpufed[replay]' (or pass --no-plots)"
        ) from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _utilization(plt: Any, run: ReplayRun, report: dict[str, Any], path: Path, title: str) -> Path:
    mids, onprem, cloud = metrics.usage_series(run.outcome)
    capacity = run.outcome.capacity_gpus or 1
    fig, ax = plt.subplots(figsize=(10, 4))
    days = [t / _DAY for t in mids]
    ax.plot(days, [100.0 * g / capacity for g in onprem], lw=1, label="on-prem GPUs allocated")
    window = report["window"]
    start, end = window["start_s"] / _DAY, window["end_s"] / _DAY
    ax.axvspan(start, end, color="0.9", zorder=0, label="steady window")
    ax.set_xlabel("days since the first submission")
    ax.set_ylabel(f"% of {capacity} on-prem GPUs")
    ax.set_ylim(0, 105)
    if any(cloud):
        twin = ax.twinx()
        twin.plot(days, cloud, lw=1, color="tab:orange", label="cloud GPUs allocated")
        twin.set_ylabel("cloud GPUs")
        twin.legend(loc="upper right")
    ax.legend(loc="upper left")
    ax.set_title(f"Utilisation ({title}): {100 * report['utilization']:.1f}% in the window")
    return _save(plt, fig, path)


def _wait_cdf(plt: Any, run: ReplayRun, path: Path, title: str) -> Path:
    waits = sorted(metrics.waits(run.outcome))
    fig, ax = plt.subplots(figsize=(6, 4))
    if waits:
        n = len(waits)
        # Waits of 0 cannot go on a log axis: show them at 1 s.
        ax.step([max(w, 1.0) for w in waits], [(k + 1) / n for k in range(n)], where="post")
        ax.set_xscale("log")
    ax.set_xlabel("queueing delay (s, first start - submit; 0 shown at 1)")
    ax.set_ylabel("fraction of started jobs")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(f"Queueing delay CDF ({title})")
    return _save(plt, fig, path)


def _team_shares(plt: Any, report: dict[str, Any], path: Path, title: str) -> Path:
    teams = report["teams"]
    names = sorted(teams, key=lambda t: -(teams[t]["guarantee_gpus"] or 0))
    held = [teams[t]["avg_gpus_held"] or 0.0 for t in names]
    guaranteed = [teams[t]["guarantee_gpus"] or 0.0 for t in names]
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(names) + 2), 4))
    x = range(len(names))
    ax.bar([i - 0.2 for i in x], guaranteed, width=0.4, label="guaranteed GPUs")
    ax.bar([i + 0.2 for i in x], held, width=0.4, label="average GPUs held (window)")
    ax.set_xticks(list(x))
    ax.set_xticklabels(names, rotation=45, ha="right")
    ax.set_ylabel("GPUs")
    ax.legend()
    ax.set_title(f"Team share vs guarantee ({title})")
    return _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
