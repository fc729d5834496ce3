"""A workload's record moved through its lifecycle: what a person reads of it on the way."""

from __future__ import annotations

from hub import transitions
from hub.core.lifecycle import EndReason
from hub.records import WorkloadRecord
from schemas import Assignment, Phase, WorkloadSpec


def _running(wid: str) -> WorkloadRecord:
    spec = WorkloadSpec(name=wid, team="nlp", gpus=1, command=["sleep", "60"])
    w = WorkloadRecord(id=wid, spec=spec, submitted_at=0.0)
    transitions.place(w, "eu-1", (Assignment(node="n0", devices=(0,)),), 1.0)
    transitions.start(w, 2.0)
    return w


def test_a_requeued_workload_says_why_it_is_queued_before_any_cycle_looks_at_it() -> None:
    # Preempted: requeued for free, and the spoke's end detail is only an exit code.
    w = _running("w1")
    transitions.end(w, EndReason.PREEMPTED, 3.0, "exit code -15")
    assert w.phase == Phase.QUEUED
    assert w.message == "queued again: its run on eu-1 ended (preempted)"
    assert w.reason == ""  # no cycle has given it a code yet (`not_considered_yet`)
    # The cycle that places it again clears it, as it does a cycle's explanation.
    transitions.place(w, "eu-2", (Assignment(node="n1", devices=(0,)),), 4.0)
    assert (w.reason, w.message) == ("", "")


def test_a_finished_workload_keeps_its_end_not_a_queue_message() -> None:
    w = _running("w2")
    transitions.end(w, EndReason.FAILED, 3.0, "exit code 1")  # restart_policy never
    assert w.phase == Phase.FAILED
    assert (w.reason, w.message) == ("failed", "exit code 1")
