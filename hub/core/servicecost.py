"""What a service's requests cost: replica GPU time priced per GPU-hour, per 1,000 requests.

Pure: the replicas' runs and the requests they served in, dollars out. A replica's run is
priced at its spoke's price per GPU-hour (the capacity report's `price_per_gpu_hour`, as
placement ranks spokes by); idle replicas cost as much as busy ones, so a service kept up
without traffic shows what that costs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaRun:
    """One run of a replica: `gpus` held from `start` to `end` (None: still running)."""

    gpus: float
    start: float
    end: float | None
    price_per_gpu_hour: float


def gpu_dollars(runs: list[ReplicaRun], now: float) -> tuple[float, float]:
    """(GPU-seconds, dollars) of `runs` up to `now`."""
    seconds = 0.0
    dollars = 0.0
    for run in runs:
        held = max(0.0, (run.end if run.end is not None else now) - run.start) * run.gpus
        seconds += held
        dollars += held / 3600 * run.price_per_gpu_hour
    return seconds, dollars


def cost_per_1k_requests(dollars: float, requests: int) -> float | None:
    """Dollars per 1,000 requests; None before the first request (no meaningful figure)."""
    if requests <= 0:
        return None
    return dollars / requests * 1000
