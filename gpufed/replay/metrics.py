"""Scheduling-quality metrics of a replay, with the usual definitions (Gavel, Blox, Starburst).

- **Steady window**: from the time `lo` (10 %) of the jobs have arrived to the time `hi` (90 %)
  have arrived: the k-th arrival for k = ceil(lo * n) and ceil(hi * n). Warm-up (an empty
  cluster) and tail (no new arrivals) would flatter or hurt utilisation.
- **Utilisation**: GPU-time allocated on on-prem spokes within the window / (on-prem GPUs x
  window length). A fraction of a GPU counts as its share; a job being preempted holds its
  GPUs until it stops. Cloud GPUs are reported apart (GPU-hours, cost).
- **JCT**: completion - submit, over the jobs that finished (all of them, not only the window).
  p50 / p99 interpolate linearly between ranks.
- **Queueing delay (wait)**: first start - submit, over the jobs that started; also apart for
  wide jobs (>= `WIDE_GPUS` GPUs), the gangs a greedy scheduler starves first.
- **Bounded slowdown**: JCT / max(run time, `BSLD_TAU_S`), at least 1, over the finished jobs
  (Feitelson's definition; the bound keeps seconds-long jobs from dominating the average).
- **Finish-time fairness** of a team: its average JCT here / its average JCT alone on its
  guarantee (the `static` run), over the jobs that finished in both; below 1 the team is
  better off sharing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpufed.replay.cloud import Instance
from gpufed.replay.simulator import Outcome


@dataclass(frozen=True, slots=True)
class Window:
    """The steady window, virtual seconds."""

    start: float
    end: float

    @property
    def length(self) -> float:
        """Seconds in the window."""
        return self.end - self.start


def steady_window(submits: Sequence[float], lo: float = 0.1, hi: float = 0.9) -> Window:
    """From the time a share `lo` of the jobs had arrived to the time `hi` had (sorted times).

    Falls back to the whole arrival span when that is empty (a handful of jobs at once).
    """
    if not submits:
        return Window(0.0, 0.0)
    n = len(submits)
    start = submits[max(0, math.ceil(lo * n) - 1)]
    end = submits[max(0, math.ceil(hi * n) - 1)]
    if end <= start:
        return Window(submits[0], submits[-1])
    return Window(start, end)


def utilization(outcome: Outcome, window: Window) -> float:
    """On-prem GPU-time allocated within `window` / on-prem GPU-time available in it."""
    available = outcome.capacity_gpus * window.length
    if available <= 0:
        return 0.0
    jobs = outcome.jobs
    held = sum(
        jobs[i].gpus * _overlap(start, end, window)
        for start, end, i, cloud in outcome.segments
        if not cloud
    )
    return held / available


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), interpolating linearly between ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """avg, p50 and p99 of `values` (None when empty)."""
    return {
        "avg": sum(values) / len(values) if values else None,
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
    }


def jcts(outcome: Outcome) -> list[float]:
    """Completion - submit of every finished job."""
    return [end - job.submit for job, end in zip(outcome.jobs, outcome.end, strict=True) if end]


def waits(outcome: Outcome) -> list[float]:
    """First start - submit of every started job."""
    return [
        start - job.submit
        for job, start in zip(outcome.jobs, outcome.first_start, strict=True)
        if start is not None
    ]


#: Run time below which a job's slowdown is taken against this instead (seconds).
BSLD_TAU_S = 10.0
#: Jobs with at least this many GPUs count as wide (their waits are reported apart).
WIDE_GPUS = 32


def bounded_slowdowns(outcome: Outcome, tau: float = BSLD_TAU_S) -> list[float]:
    """JCT / max(duration, tau), at least 1, of every finished job."""
    return [
        max(1.0, (end - job.submit) / max(job.duration, tau))
        for job, end in zip(outcome.jobs, outcome.end, strict=True)
        if end
    ]


def wide_waits(outcome: Outcome, gpus: float = WIDE_GPUS) -> list[float]:
    """First start - submit of every started job with at least `gpus` GPUs."""
    return [
        start - job.submit
        for job, start in zip(outcome.jobs, outcome.first_start, strict=True)
        if start is not None and job.gpus >= gpus
    ]


def team_stats(
    outcome: Outcome,
    window: Window,
    guarantees: Mapping[str, float],
    isolated: Outcome | None = None,
) -> dict[str, dict[str, float | int | None]]:
    """Per team: jobs, finished, average JCT and wait, GPU-hours, average GPUs held in the
    window (on-prem and cloud) against its guarantee, and finish-time fairness vs `isolated`."""
    held: dict[str, float] = defaultdict(float)
    gpu_s: dict[str, float] = defaultdict(float)
    for start, end, i, _ in outcome.segments:
        job = outcome.jobs[i]
        held[job.team] += job.gpus * _overlap(start, end, window)
        gpu_s[job.team] += job.gpus * (end - start)
    by_team: dict[str, list[int]] = defaultdict(list)
    for i, job in enumerate(outcome.jobs):
        by_team[job.team].append(i)
    stats: dict[str, dict[str, float | int | None]] = {}
    for team in sorted(set(by_team) | set(guarantees)):
        members = by_team.get(team, [])
        done = [i for i in members if outcome.end[i] is not None]
        started = [i for i in members if outcome.first_start[i] is not None]
        stats[team] = {
            "jobs": len(members),
            "finished": len(done),
            "guarantee_gpus": guarantees.get(team, 0.0),
            "avg_gpus_held": held[team] / window.length if window.length > 0 else None,
            "gpu_hours": gpu_s[team] / 3600.0,
            "avg_jct_s": _mean(_jct(outcome, i) for i in done),
            "avg_wait_s": _mean(_wait(outcome, i) for i in started),
            "finish_time_fairness": _fairness(outcome, isolated, done),
        }
    return stats


def cloud_stats(instances: Iterable[Instance], until: float) -> dict[str, float | int]:
    """Instances launched, those that never ran a job, GPU-hours and dollars billed."""
    count = unused = 0
    gpu_hours = cost = 0.0
    for instance in instances:
        count += 1
        unused += instance.placed == 0
        end = instance.terminated_at if instance.terminated_at is not None else until
        gpu_hours += instance.gpu_count * max(0.0, end - instance.launched_at) / 3600.0
        cost += instance.cost(until)
    return {"instances": count, "unused_instances": unused, "gpu_hours": gpu_hours, "cost": cost}


def usage_series(outcome: Outcome, bins: int = 400) -> tuple[list[float], list[float], list[float]]:
    """Bin mid-times and the average on-prem and cloud GPUs held in each bin."""
    start, end = 0.0, outcome.finished_at
    if end <= start or bins <= 0:
        return [], [], []
    width = (end - start) / bins
    onprem = [0.0] * bins
    cloud = [0.0] * bins
    for s, e, i, on_cloud in outcome.segments:
        _spread(onprem if not on_cloud else cloud, s, e, outcome.jobs[i].gpus, start, width)
    mids = [start + (k + 0.5) * width for k in range(bins)]
    return mids, [v / width for v in onprem], [v / width for v in cloud]


# --- helpers ---


def _overlap(start: float, end: float, window: Window) -> float:
    return max(0.0, min(end, window.end) - max(start, window.start))


def _mean(values: Iterable[float]) -> float | None:
    items = list(values)
    return sum(items) / len(items) if items else None


def _jct(outcome: Outcome, i: int) -> float:
    end = outcome.end[i]
    assert end is not None
    return end - outcome.jobs[i].submit


def _wait(outcome: Outcome, i: int) -> float:
    start = outcome.first_start[i]
    assert start is not None
    return start - outcome.jobs[i].submit


def _fairness(outcome: Outcome, isolated: Outcome | None, done: list[int]) -> float | None:
    if isolated is None:
        return None
    ids = {job.id: k for k, job in enumerate(isolated.jobs)}
    pairs = []
    for i in done:
        k = ids.get(outcome.jobs[i].id)
        if k is not None and isolated.end[k] is not None:
            pairs.append((_jct(outcome, i), _jct(isolated, k)))
    alone = sum(b for _, b in pairs)
    if not pairs or alone <= 0:
        return None
    return sum(a for a, _ in pairs) / alone


def _spread(into: list[float], s: float, e: float, gpus: float, t0: float, width: float) -> None:
    """Add gpus x seconds of [s, e) into the bins it overlaps."""
    first = max(0, int((s - t0) // width))
    last = min(len(into) - 1, int((e - t0) // width))
    if first == last:
        into[first] += gpus * (e - s)
        return
    into[first] += gpus * (t0 + (first + 1) * width - s)
    for k in range(first + 1, last):
        into[k] += gpus * width
    into[last] += gpus * (e - (t0 + last * width))
