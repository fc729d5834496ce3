"""Usage that adds up: every attempt counts, every instance's whole bill is someone's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub import transitions
from hub.core.lifecycle import EndReason
from hub.records import SpokeRecord, WorkloadRecord
from hub.usage import (
    GroupBy,
    InstanceBill,
    accrue_bill,
    attempts_of,
    bill_breakdown,
    bill_cost,
    usage_report,
)
from schemas import WorkloadSpec
from schemas.burst import InstanceEvent, InstanceState, Market

H = 3600.0


Run = tuple[str, float, "float | None", EndReason]  # spoke, started, ended (None: runs), why


def workload(wid: str, team: str, gpus: int, runs: list[Run], user: str = "") -> WorkloadRecord:
    """A workload moved through the hub's own transitions: placed, started, ended per run."""
    w = WorkloadRecord(
        id=wid,
        spec=WorkloadSpec(name=wid, team=team, gpus_per_node=gpus, command=("true",)),
        submitted_at=0.0,
        user=user,
    )
    for spoke_id, start, end, reason in runs:
        transitions.place(w, spoke_id, (), start)
        transitions.start(w, start)
        if end is not None:
            transitions.end(w, reason, end, "")
    return w


def spoke(sid: str, kind: str = "onprem") -> SpokeRecord:
    return SpokeRecord(id=sid, region="eu", kind=kind, first_seen=0, last_seen=0)


SPOKES = {"eu-1": spoke("eu-1"), "us-1": spoke("us-1"), "burst-1": spoke("burst-1", "cloud")}


def preempted_then_succeeded() -> WorkloadRecord:
    # Ran 1 h on eu-1, was preempted and requeued, then ran 2 h on us-1.
    return workload(
        "w1",
        "vision",
        2,
        [
            ("eu-1", 100, 100 + H, EndReason.PREEMPTED),
            ("us-1", 300 + H, 300 + 3 * H, EndReason.SUCCEEDED),
        ],
    )


def test_a_preempted_run_counts_as_much_as_the_last_one() -> None:
    attempts = attempts_of(preempted_then_succeeded())
    assert [(a.spoke_id, a.start, a.end, a.outcome) for a in attempts] == [
        ("eu-1", 100, 100 + H, "preempted"),
        ("us-1", 300 + H, 300 + 3 * H, "succeeded"),
    ]
    report = usage_report([preempted_then_succeeded()], SPOKES, [], now=10 * H)
    assert report["rows"]["vision"]["gpu_hours_onprem"] == pytest.approx(2 * 3)  # 2 GPUs x 3 h
    assert report["rows"]["vision"]["attempts"] == 2


def test_a_running_attempt_counts_up_to_now_and_windows_clip() -> None:
    w = workload("w2", "nlp", 1, [("eu-1", 0, None, EndReason.SUCCEEDED)])
    assert usage_report([w], SPOKES, [], now=2 * H)["totals"]["gpu_hours_onprem"] == 2
    clipped = usage_report([w], SPOKES, [], now=2 * H, since=H / 2, until=H)
    assert clipped["totals"]["gpu_hours_onprem"] == pytest.approx(0.5)


def test_a_workload_lost_with_its_spoke_keeps_the_run_it_had() -> None:
    w = workload(
        "w3",
        "nlp",
        4,
        [("eu-1", 0, H, EndReason.LOST_ON_SPOKE), ("us-1", H, 2 * H, EndReason.FAILED)],
    )
    by_spoke = usage_report([w], SPOKES, [], now=3 * H, by=GroupBy.SPOKE)["rows"]
    assert by_spoke["eu-1"]["gpu_hours_onprem"] == 4
    assert by_spoke["us-1"]["gpu_hours_onprem"] == 4


def test_a_placement_that_never_ran_uses_nothing() -> None:
    w = WorkloadRecord(
        id="w5",
        spec=WorkloadSpec(name="w5", team="nlp", gpus_per_node=8, command=("true",)),
        submitted_at=0.0,
    )
    transitions.place(w, "eu-1", (), 10)
    transitions.end(w, EndReason.REJECTED, 20, "bad assignment")
    assert attempts_of(w) == []
    assert usage_report([w], SPOKES, [], now=H)["rows"] == {}


def event(state: InstanceState, at: float, team: str = "vision") -> InstanceEvent:
    return InstanceEvent(
        burst_id="burst-1",
        provider="local",
        instance_type="sim",
        region="us-east-1",
        market=Market.SPOT,
        price_per_hour=2.0,
        team=team,
        state=state,
        at=at,
    )


def a_bill() -> InstanceBill:
    bill = None
    for state, at in [
        (InstanceState.REQUESTED, 0),
        (InstanceState.RUNNING, 0.25 * H),
        (InstanceState.RUNNING, 0.5 * H),
        (InstanceState.TERMINATING, 2 * H),
        (InstanceState.TERMINATED, 2.25 * H),
        (InstanceState.TERMINATED, 3 * H),
    ]:
        bill = accrue_bill(bill, event(state, at))
    assert bill is not None
    return bill


def test_an_instance_is_billed_from_request_to_end_boot_and_idle_included() -> None:
    bill = a_bill()
    assert (bill.requested_at, bill.running_at, bill.ended_at) == (0, 0.25 * H, 2.25 * H)
    assert bill_cost(bill, now=10 * H) == pytest.approx(2.25 * 2.0)
    job = workload("w4", "vision", 1, [("burst-1", 0.5 * H, 1.5 * H, EndReason.SUCCEEDED)])
    parts = bill_breakdown(bill, attempts_of(job), now=10 * H)
    assert parts == {"boot_s": 0.25 * H, "busy_s": 1.0 * H, "idle_s": 1.0 * H}
    report = usage_report([job], SPOKES, [bill], now=10 * H)
    assert report["rows"]["vision"]["cloud_cost"] == pytest.approx(4.5)
    assert report["rows"]["vision"]["gpu_hours_cloud"] == pytest.approx(1.0)
    assert report["instances"][0]["cost"] == pytest.approx(4.5)


def test_a_live_instance_costs_up_to_now() -> None:
    bill = accrue_bill(None, event(InstanceState.REQUESTED, 0))
    assert bill_cost(bill, now=H) == pytest.approx(2.0)
    assert bill_cost(bill, now=H, since=0.5 * H) == pytest.approx(1.0)


spans = st.lists(
    st.tuples(
        st.sampled_from(["vision", "nlp", "audio"]),
        st.sampled_from(["eu-1", "us-1", "burst-1"]),
        st.integers(1, 8),
        st.lists(st.tuples(st.floats(0, 5 * H), st.floats(1, H)), min_size=1, max_size=4),
        st.sampled_from(["ana", "bo", ""]),
    ),
    max_size=12,
)
bills = st.lists(
    st.tuples(
        st.sampled_from(["vision", "nlp"]),
        st.floats(0, 5 * H),
        st.floats(0, H),
        st.one_of(st.none(), st.floats(0, 3 * H)),
        st.floats(0, 40),
    ),
    max_size=5,
)


@given(spans, bills, st.floats(0, 3 * H), st.floats(0, 4 * H))
def test_totals_are_the_sum_of_attempts_and_of_bills_whatever_the_grouping(
    runs: list, rented: list, since: float, length: float
) -> None:
    now = 8 * H
    records = []
    for i, (team, sid, gpus, tries, user) in enumerate(runs):
        done: list[Run] = []
        t = 0.0
        for start, duration in tries:
            t = max(t, start)
            done.append((sid, t, t + duration, EndReason.PREEMPTED))
            t += duration
        records.append(workload(f"w{i}", team, gpus, done, user=user))
    bill_list = [
        InstanceBill(
            burst_id=f"b{i}",
            team=team,
            spoke_id="burst-1",
            provider="local",
            instance_type="sim",
            price_per_hour=price,
            requested_at=start,
            running_at=start + boot,
            ended_at=None if life is None else start + boot + life,
        )
        for i, (team, start, boot, life, price) in enumerate(rented)
    ]
    until = since + length
    expected_hours = sum(
        max(0.0, min(a.end or now, until) - max(a.start, since)) / H * a.gpus
        for w in records
        for a in attempts_of(w)
    )
    expected_cost = sum(bill_cost(b, now, since, until) for b in bill_list)
    for by in GroupBy:
        report = usage_report(records, SPOKES, bill_list, now, since=since, until=until, by=by)
        rows = report["rows"].values()
        hours = sum(r["gpu_hours_onprem"] + r["gpu_hours_cloud"] for r in rows)
        assert hours == pytest.approx(expected_hours, abs=1e-3)
        assert report["totals"]["cloud_cost"] == pytest.approx(expected_cost, abs=1e-3)
        if by != GroupBy.USER:
            assert sum(r["cloud_cost"] for r in rows) == pytest.approx(expected_cost, abs=1e-3)
