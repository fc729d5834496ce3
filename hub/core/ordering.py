"""Least attained service within borrowed GPUs (Tiresias' discretised 2D-LAS).

Guarantees, priority classes and reclaim decide first, as documented; this module only decides
who gets the GPUs teams borrow beyond their guarantees (`Policy.ordering`, mode `las`):

- A workload's **attained service** is the GPU-seconds it has run so far: every earlier attempt
  (`attained_gpu_s`) plus, while it runs, GPUs x time since it started. No run-time estimate is
  needed. Its **level** is the number of thresholds (`thresholds_gpu_s`, GPU-seconds) it has
  passed: level 0 until the first, and so on (Tiresias' discretised queues: continuous
  priorities would make jobs preempt each other back and forth).
- **Queue order**: within an aged priority band the lowest level goes first, then fair share and
  age as before (`hub.core.fairshare`). Fresh work is level 0, so it goes before work that was
  stopped after running long.
- **Taking borrowed GPUs**: a workload that finds no room may preempt another team's running
  work of a higher level, of its own priority class or lower, while that team keeps at least
  its guarantee (only GPUs beyond it are taken). Gangs of `exempt_gpus` GPUs or more are never
  taken this way (plain 2D-LAS demotes wide gangs first and starves them).
- **Patience**: a workload takes borrowed GPUs this way only once `patience_s` has passed since
  it was submitted; before that it waits for GPUs that free up by themselves (on a busy cluster
  of many short jobs most do within minutes), so fewer jobs are stopped for it. Work is taken
  only after running `min_run_s` since it last started, work that ran before (an earlier
  attempt) only after `resumed_min_run_s`, if longer: the same long job is not stopped, resumed
  and stopped again over and over.
- **Starvation guard**: a pending workload that has waited `promote_knob` times as long as it
  has run goes back to level 0 (Tiresias' PromoteKnob).

Mode `fifo` gives everyone level 0: the order is then fair share and age, and nothing is
preempted here. Pure: the clock is the `now` plan() is given.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator

from hub.core.capacity import EPS
from hub.core.holdings import VICTIM_ORDER, Holding
from hub.core.lifecycle import Attempt
from hub.core.model import RunningWorkload, Workload
from hub.core.policy import Ordering
from hub.core.victims import Victims


def attained(r: RunningWorkload, now: float) -> float:
    """GPU-seconds `r` has run: earlier attempts plus this one so far."""
    return r.attained_gpu_s + max(0.0, now - r.started_at) * r.need.total_gpus


def level_of(service: float, ordering: Ordering) -> int:
    """The queue level of `service` GPU-seconds: how many thresholds it has passed."""
    if ordering.mode != "las":
        return 0
    return bisect_right(ordering.thresholds_gpu_s, service)


def pending_level(w: Workload, ordering: Ordering, now: float) -> int:
    """The level a pending workload queues at (0 again once it has waited long enough)."""
    if ordering.mode != "las" or w.attained_gpu_s <= 0:
        return 0
    level = level_of(w.attained_gpu_s, ordering)
    if level and ordering.promote_knob > 0:
        ran = w.attained_gpu_s / max(w.need.total_gpus, EPS)
        if now - w.submitted_at - ran >= ordering.promote_knob * ran:
            return 0
    return level


def rescue_level(w: Workload, ordering: Ordering, now: float) -> int:
    """The level `w` takes borrowed GPUs at: its queue level, or the top level (nothing above
    it to take) while it is within its patience.

    A workload within its patience may preempt exactly as much as one on the top level, so the
    placement core's memo of failed searches (keyed by level) stays sound.
    """
    if ordering.mode == "las" and now - w.submitted_at < ordering.patience_s:
        return len(ordering.thresholds_gpu_s)
    return pending_level(w, ordering, now)


def served(attempts: Iterable[Attempt], gpus: float) -> float:
    """GPU-seconds of the attempts that started and ended (a live one counts from started_at)."""
    total = 0.0
    for a in attempts:
        if a.started_at is not None and a.ended_at is not None and a.ended_at > a.started_at:
            total += (a.ended_at - a.started_at) * gpus
    return total


def las_victims(
    victims: Victims,
    model: str,
    team: str,
    level: int,
    value: int,
    ordering: Ordering,
    now: float,
) -> Iterator[Holding]:
    """Other teams' running `model` work that a level-`level` workload may take, victim order.

    Only work above `level`, of priority `value` or lower, preemptible, narrower than
    `exempt_gpus`, from teams running beyond their guarantee, and no more of a team's GPUs than
    it runs beyond its guarantee (counting victims this plan chose already).
    """
    if ordering.mode != "las" or level + 1 > len(ordering.thresholds_gpu_s):
        return
    found: list[Holding] = []
    resumed_min = max(ordering.min_run_s, ordering.resumed_min_run_s)
    for other, beyond in victims.beyond_guarantee(model):
        if other == team or beyond <= EPS:
            continue
        work = list(victims.team_work(other, model))
        left = beyond - sum(h.amount for h in work if h.id in victims.chosen)
        for h in sorted(work, key=VICTIM_ORDER):  # any of them together stays within `beyond`
            if (
                h.id not in victims.chosen
                and h.preemptible
                and h.value <= value
                and (ordering.exempt_gpus <= 0 or h.amount < ordering.exempt_gpus)
                and h.amount <= left + EPS
                and now - h.started_at
                >= (resumed_min if h.workload.attained_gpu_s > 0 else ordering.min_run_s)
                and level_of(attained(h.workload, now), ordering) > level
            ):
                found.append(h)
                left -= h.amount
    found.sort(key=_widest_first)
    yield from found


def _widest_first(h: Holding) -> tuple[int, float, float, str]:
    """Lowest priority, then widest (one preemption frees room for several), then newest."""
    return (h.value, -h.amount, -h.started_at, h.id)
