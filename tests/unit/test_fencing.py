"""The spoke's lease on its movable work, from the hub's acknowledgements."""

from __future__ import annotations

import sys
from pathlib import Path

import structlog

from gpufed import logs
from schemas import LeaseAck, WorkloadSpec
from spoke.fencing import Fence, OwnStalls


def ack(seq: int, lost_after: float = 30.0) -> LeaseAck:
    return LeaseAck(spoke_id="eu-1", incarnation="i", seq=seq, lost_after_s=lost_after)


def fence(tmp_path: Path, **kw: float) -> Fence:
    return Fence(tmp_path / "fence.json", heartbeat_s=2.0, stop_grace_s=5.0, **kw)


def test_heard_counts_from_when_the_acknowledged_report_was_sent(tmp_path: Path) -> None:
    f = fence(tmp_path)
    f.sent(1, at=100.0)
    f.sent(2, at=102.0)
    assert not f.overdue(10_000.0)  # never heard: nothing to fence yet
    assert f.acked(ack(1))
    assert f.heard_at == 100.0  # not when the ack arrived: the hub saw it no earlier
    assert f.fence_after_s == 30.0 - 5.0 - 3 * 2.0
    assert not f.overdue(119.0)
    assert f.overdue(119.5)
    assert not f.acked(ack(7))  # never sent by this incarnation
    assert f.acked(ack(2)) and not f.overdue(119.5)


def test_a_setting_can_only_lower_fence_after(tmp_path: Path) -> None:
    assert not fence(tmp_path, fence_after_s=1.0).overdue(1e9)  # never heard the hub
    low, high = fence(tmp_path, fence_after_s=5.0), fence(tmp_path, fence_after_s=60.0)
    for f in (low, high):
        f.sent(1, at=0.0)
        f.acked(ack(1))
    assert (low.fence_after_s, high.fence_after_s) == (5.0, 19.0)


def test_the_lease_and_kept_work_survive_a_restart(tmp_path: Path) -> None:
    f = fence(tmp_path)
    f.sent(1, at=50.0)
    f.acked(ack(1))
    f.placed("w-keep", fenced=False)
    f.placed("w-move", fenced=True)
    f.save()
    again = fence(tmp_path)
    assert (again.heard_at, again.kept) == (50.0, {"w-keep"})
    assert again.overdue(50.0 + 19.5)


def test_which_work_is_fenced() -> None:
    def spec(**kw: str) -> WorkloadSpec:
        return WorkloadSpec(name="w", team="t", command=("x",), **kw)  # type: ignore[arg-type]

    assert spec(restart_policy="on_failure").fenced
    assert not spec().fenced  # never rerun elsewhere: nothing to fence against
    assert spec(on_hub_loss="stop").fenced
    assert not spec(restart_policy="on_failure", on_hub_loss="keep").fenced
    assert not spec(restart_policy="on_failure", on_hub_loss="keep").moved_when_spoke_lost


def test_no_hub_to_answer_is_no_ack_and_is_said_once_per_silence(tmp_path: Path) -> None:
    f = fence(tmp_path)
    f.sent(1, at=100.0)
    f.acked(ack(1))
    with structlog.testing.capture_logs() as logs:
        for at in (101.0, 110.0, 125.0):
            f.sent(2, at=at)
            f.no_hub(at)
        assert f.heard_at == 100.0 and f.overdue(125.0)  # the silence went on
        f.sent(3, at=126.0)
        assert f.acked(ack(3)) and not f.overdue(126.0)
        f.no_hub(127.0)
    said = [e for e in logs if e["event"] == "hub_not_reachable"]
    assert [e["silent_s"] for e in said] == [1.0, 1.0]  # once per silence, again after an ack


def test_a_spoke_up_before_its_hub_says_so_without_a_warning(tmp_path: Path) -> None:
    """Under `gpufed up` every spoke starts before the hub answers: that is no silence of a
    hub it had (no lease to lose, nothing to fence), so no warning with empty figures."""
    logs.configure(sys.stderr, json=False, level="info")  # the tests' own is warning
    f = fence(tmp_path)
    with structlog.testing.capture_logs() as said:
        f.sent(1, at=100.0)
        f.no_hub(100.0)
        f.no_hub(101.0)
        f.sent(2, at=102.0)
        assert f.acked(ack(2))
    assert [(e["event"], e["log_level"]) for e in said] == [
        ("hub_not_up_yet", "info"),
        ("hub_heard_again", "info"),
    ]


def test_a_silence_of_the_spokes_own_holds_fencing_for_a_heartbeat() -> None:
    stalls = OwnStalls(every_s=0.1, hold_s=0.2, now=0.0)
    # Checks on time: fencing goes as the lease says.
    assert not stalls.holds(0.1, overdue=True)
    assert not stalls.holds(0.2, overdue=False)
    # Held up 1.6 s (a collector's pause) with the lease overdue: it reports and waits a
    # heartbeat for the hub's answer, then fences as before.
    assert stalls.holds(1.8, overdue=True)
    assert stalls.holds(1.9, overdue=True)
    assert not stalls.holds(2.05, overdue=True)
    # A stall with the lease still running holds nothing.
    assert not stalls.holds(4.0, overdue=False)
