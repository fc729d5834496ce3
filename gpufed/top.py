"""`gpufed top`: the fleet, the teams and the queue in the terminal, redrawn every few seconds."""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpufed.client import ApiError, HubClient

_CLEAR = "\x1b[H\x1b[2J"
QUEUE_ROWS = 15


def run_top(client: HubClient, interval_s: float, *, once: bool = False) -> int:
    """Redraw until Ctrl-C (or once). A hub that stops answering is shown, not fatal."""
    try:
        while True:
            try:
                text = frame(
                    client.spokes(),
                    client.workloads(phase="queued,placed,running", limit=5000),
                    client.teams(),
                    time.time(),
                    shutil.get_terminal_size().columns,
                )
            except ApiError as exc:
                if once:
                    raise
                text = f"gpufed top: {exc}\n(retrying every {interval_s:g}s)"
            if once:
                print(text)
                return 0
            sys.stdout.write(_CLEAR + text + "\n")
            sys.stdout.flush()
            time.sleep(interval_s)
    except KeyboardInterrupt:
        return 0


def frame(
    spokes: Sequence[dict[str, Any]],
    workloads: Sequence[dict[str, Any]],
    teams: Sequence[dict[str, Any]],
    now: float,
    width: int = 100,
) -> str:
    """One screen: GPUs per model, spokes, teams, and the head of the queue."""
    models: dict[str, list[float]] = {}
    for s in spokes:
        if s["status"] == "lost" or s.get("cordoned"):  # out of the pool: none on offer
            continue
        for model, g in s["gpus"].items():
            m = models.setdefault(model, [0.0, 0.0])
            m[0] += g["total"] - g["free"]
            m[1] += g["total"]
    queued = sorted(
        (w for w in workloads if w["phase"] == "queued"),
        key=lambda w: (w.get("position") or 1e9, w["submitted_at"]),
    )
    running = [w for w in workloads if w["phase"] in ("placed", "running")]
    lines = [
        f"gpufed top - {time.strftime('%H:%M:%S', time.localtime(now))} - "
        f"{len(spokes)} spokes, {len(running)} running, {len(queued)} queued",
        "",
    ]
    bar_width = max(10, min(40, width - 40))
    for model, (used, total) in sorted(models.items()):
        filled = round(bar_width * used / total) if total else 0
        bar = "#" * filled + "." * (bar_width - filled)
        lines.append(f"  {model:<8} [{bar}] {used:g}/{total:g} in use")
    lines.append("")
    lines += _table(
        [("SPOKE", "REGION", "STATUS", "GPUS FREE/TOTAL", "RUNNING")]
        + [
            (
                s["id"],
                s["region"],
                spoke_status(s),
                ", ".join(
                    f"{m} {g['free']:g}/{g['total']:g}" for m, g in sorted(s["gpus"].items())
                ),
                str(s["running"]),
            )
            for s in spokes
        ]
    )
    lines.append("")
    lines += _table(
        [("TEAM", "GUARANTEED", "USING", "BORROWING", "QUEUED", "CLOUD $")]
        + [
            (
                t["team"],
                f"{t['guaranteed']:g}",
                f"{t['using']:g}",
                f"{t['borrowing']:g}",
                str(t["queued"]),
                f"{t['cloud_cost']:.2f}",
            )
            for t in teams
        ]
    )
    lines.append("")
    lines += _table(
        [("POS", "ID", "NAME", "TEAM", "CLASS", "GPUS", "WAITING", "WHY")]
        + [
            (
                str(w.get("position") or "-"),
                w["id"],
                w["spec"]["name"],
                w["spec"]["team"],
                w["spec"]["priority_class"],
                _gpus(w["spec"]),
                f"{w['wait_s']:.0f}s",
                w["message"] or "not looked at yet",
            )
            for w in queued[:QUEUE_ROWS]
        ]
    )
    if len(queued) > QUEUE_ROWS:
        lines.append(f"  ... and {len(queued) - QUEUE_ROWS} more")
    return "\n".join(line[:width] for line in lines)


def _gpus(spec: dict[str, Any]) -> str:
    if spec.get("gpu_fraction"):
        return f"{spec['gpu_fraction']:g}"
    if spec["nodes"] > 1:
        return f"{spec['nodes']}x{spec['gpus_per_node']}"
    return str(spec["gpus_per_node"])


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def spoke_status(spoke: dict[str, Any]) -> str:
    """A spoke's lease state, and `cordoned` when an operator took it out of placement."""
    return f"{spoke['status']}, cordoned" if spoke.get("cordoned") else str(spoke["status"])
