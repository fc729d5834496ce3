"""The cycle's views of the records follow what moved, and what moved without telling is caught.

The scheduling cycle keeps the core's view of every workload and makes it again only for the
records that moved (`hub.records.Records`). Random sequences of submissions, placements,
starts, preemptions, ends, refusals, claims and replaced records must leave the views equal to
views made from every record afresh, and the list of what moved (the kept placement state's
feed) complete. A record that moves without telling is found by the check every
`VERIFY_EVERY` reads, logged, and its view made again.
"""

from __future__ import annotations

from typing import cast

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from bus.client import Bus
from hub import transitions
from hub.core.lifecycle import EndReason
from hub.core.model import RunningWorkload, Workload
from hub.core.ordering import served
from hub.core.policy import Policy
from hub.cycle import VERIFY_EVERY, Cycle
from hub.leases import Leases
from hub.ports import Store
from hub.publishing import Publisher
from hub.records import WorkloadRecord
from hub.settings import HubSettings
from hub.state import HubState
from schemas import Assignment, Phase, WorkloadSpec

STEPS = ("submit", "place", "start", "preempt", "end", "requeue", "refuse", "claim", "replace")


def _hub() -> tuple[HubState, Cycle]:
    # Views only: nothing is saved or published.
    state = HubState(HubSettings(), cast(Store, None), lambda: 100.0, Policy())
    return state, Cycle(state, Leases(15.0, 120.0), Publisher(state, cast(Bus, None)))


def _afresh(state: HubState) -> tuple[dict[str, Workload], dict[str, RunningWorkload]]:
    """The views made from every record, as the cycle once made them each cycle."""
    pending: dict[str, Workload] = {}
    running: dict[str, RunningWorkload] = {}
    for w in state.workloads.values():
        if w.phase == Phase.QUEUED:
            pending[w.id] = Workload(
                w.id,
                w.spec,
                w.submitted_at,
                claims_freed=w.id in state.claims,
                avoid_spokes=frozenset(w.rejected_by),
                attained_gpu_s=served(w.attempts, w.spec.total_gpus),
            )
        elif (view := transitions.as_running(w)) is not None:
            running[w.id] = view
    return pending, running


def _record(serial: int) -> WorkloadRecord:
    spec = WorkloadSpec(name=f"w{serial}", team="a", command=["true"])
    return WorkloadRecord(id=f"w{serial}", spec=spec, submitted_at=float(serial))


def _step(state: HubState, data: st.DataObject, serial: int) -> None:
    kind = data.draw(st.sampled_from(STEPS))
    records = sorted(state.workloads)
    w = state.workloads[data.draw(st.sampled_from(records))] if records else None
    if kind == "submit" or w is None:
        state.workloads[f"w{serial}"] = _record(serial)
    elif kind == "place" and w.phase == Phase.QUEUED:
        transitions.place(w, "s1", (Assignment(node="n0", devices=(serial % 8,)),), 1.0)
    elif kind == "start" and w.phase == Phase.PLACED:
        transitions.start(w, 2.0)
    elif kind == "preempt" and w.live is not None and not w.live.preempting:
        transitions.mark_preempting(w, None, "test", 3.0)
    elif kind in ("end", "requeue") and w.live is not None:
        reason = EndReason.SUCCEEDED if kind == "end" else EndReason.PREEMPTED
        transitions.end(w, reason, 4.0, "")
        if w.phase.terminal:
            state.forget(w.id)
    elif kind == "refuse" and "s9" not in w.rejected_by:
        w.rejected_by = [*w.rejected_by, "s9"]
    elif kind == "claim" and w.phase == Phase.QUEUED:
        state.claim(w.id)
    elif kind == "replace":  # the same workload as a new object (read back from the store)
        state.workloads[w.id] = w.model_copy(deep=True)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_views_follow_every_move_and_tell_placement_what_moved(data: st.DataObject) -> None:
    state, cycle = _hub()
    told: dict[str, RunningWorkload] = {}  # the running work as the moved feed built it
    for serial in range(data.draw(st.integers(1, 40))):
        _step(state, data, serial)
        if data.draw(st.booleans()):
            continue  # moves pile up between cycles as well
        cycle._views_read = VERIFY_EVERY - 1  # every read checks the records too
        with capture_logs() as logs:
            pending, running, active = cycle._views()
        assert not [e for e in logs if e["log_level"] == "error"], "moves told, none stale"
        want_pending, want_running = _afresh(state)
        assert {w.id: w for w in pending} == want_pending
        assert {r.id: r for r in running} == want_running
        assert [a[0] for a in active] == running
        assert all(a[1] == state.workloads[a[0].id].epoch for a in active)
        for wid, r in cycle._moved.items():
            if r is None:
                told.pop(wid, None)
            else:
                told[wid] = r
        cycle._moved.clear()  # as a plan takes them
        assert told == want_running


def test_a_record_that_moves_without_telling_is_caught_and_its_view_made_again() -> None:
    state, cycle = _hub()
    w = _record(1)
    state.workloads[w.id] = w
    assert [p.id for p in cycle._views()[0]] == ["w1"]
    w.watch(None)  # a path that moves the record without telling, as a bug would
    transitions.place(w, "s1", (Assignment(node="n0", devices=(0,)),), 1.0)
    with capture_logs() as logs:
        for _ in range(VERIFY_EVERY):
            pending, running, _ = cycle._views()
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["cycle_views_stale"]
    assert pending == [] and [r.id for r in running] == ["w1"]
