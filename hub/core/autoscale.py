"""How many replicas a service should run, from the load its replicas see.

Pure: the load, the previous recommendations and `now` in, a decision out. The rules (as
Kubernetes' HPA and Knative's autoscaler do):

- raw = ceil(load / target per replica), clamped to [min_replicas, max_replicas];
- scaling up is immediate; scaling down takes the highest recommendation of the last
  `scale_down_delay_s`, so a short lull does not drop replicas that the next burst needs;
- with min_replicas 0, no request for `scale_to_zero_after_s` gives zero replicas;
- a request waiting while there are none asks for one at once (wake from zero).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from schemas.services import Autoscaling, ScaleMetric


class ScaleReason(StrEnum):
    """Why a decision asks for its count (shown in `gpufed service show`)."""

    LOAD = "load"  # what the load asks for
    MIN = "min_replicas"  # the load asks for fewer than the minimum
    UNTIL_IDLE = "until_idle"  # min_replicas 0: one kept until scale_to_zero_after_s idle
    MAX = "max_replicas"  # the load asks for more than the maximum
    STABILISING = "stabilising"  # load fell; kept up for scale_down_delay_s
    IDLE = "idle"  # no request for scale_to_zero_after_s: zero replicas
    WAKE = "wake"  # a request waits and there is no replica


@dataclass(frozen=True, slots=True)
class Load:
    """What the replicas of a service saw, over the metric's window.

    `rps`: requests per second (all replicas); `in_flight`: requests being served or waiting
    for a replica now; `waiting`: of those, the ones held because no replica is ready;
    `last_request_at`: when the latest request arrived (None: never).
    """

    rps: float = 0.0
    in_flight: int = 0
    waiting: int = 0
    last_request_at: float | None = None


@dataclass(frozen=True, slots=True)
class Recommendation:
    at: float
    replicas: int


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    """The replicas to run, why, and the recommendations to pass to the next decision."""

    replicas: int
    reason: ScaleReason
    history: tuple[Recommendation, ...]


def decide_replicas(
    scaling: Autoscaling,
    min_replicas: int,
    max_replicas: int,
    load: Load,
    history: tuple[Recommendation, ...],
    now: float,
    created_at: float,
) -> ScaleDecision:
    """The replica count for `load` at `now` (see the module's rules).

    `history` is the previous decision's; `created_at` (when the service was created) stands
    in for the last request of a service that has had none, so a new service waits the whole
    `scale_to_zero_after_s` before it drops to zero.
    """
    raw, reason = _raw(scaling, min_replicas, max_replicas, load, now, created_at)
    window = [r for r in history if now - r.at < scaling.scale_down_delay_s]
    recent = max((r.replicas for r in window), default=raw)
    if raw < recent and reason not in (ScaleReason.IDLE, ScaleReason.MAX):
        replicas, reason = min(recent, max_replicas), ScaleReason.STABILISING
    else:
        replicas = raw
    kept = (*window, Recommendation(now, raw))
    return ScaleDecision(replicas, reason, kept[-256:])


def _raw(
    scaling: Autoscaling,
    min_replicas: int,
    max_replicas: int,
    load: Load,
    now: float,
    created_at: float,
) -> tuple[int, ScaleReason]:
    signal = load.rps if scaling.metric == ScaleMetric.RPS else float(load.in_flight)
    wanted = math.ceil(signal / scaling.target - 1e-9) if signal > 0 else 0
    if wanted > max_replicas:
        return max_replicas, ScaleReason.MAX
    if load.waiting > 0 and max(wanted, min_replicas) < 1:
        return 1, ScaleReason.WAKE
    if wanted >= max(min_replicas, 1):
        return wanted, ScaleReason.LOAD
    if min_replicas > 0:
        return min_replicas, ScaleReason.MIN
    # min_replicas 0: keep one until the service has been idle long enough.
    last = load.last_request_at if load.last_request_at is not None else created_at
    busy = load.in_flight > 0 or now - last < scaling.scale_to_zero_after_s
    if busy:
        return 1, ScaleReason.LOAD if wanted else ScaleReason.UNTIL_IDLE
    return 0, ScaleReason.IDLE
