"""`--from-hub`: the hub's workloads, as `GET /v1/workloads` shows them, made into jobs."""

from __future__ import annotations

from typing import Any

from gpufed.replay.fromhub import run_time, to_jobs
from hub.apimodels import WorkloadOut
from hub.core import lifecycle
from hub.core.lifecycle import EndReason
from hub.records import WorkloadRecord
from schemas import WorkloadSpec

SPEC = WorkloadSpec.model_validate(
    {"name": "train", "team": "vision", "command": ["train"], "restart_policy": "on_failure"}
)
NOW = 1_000.0


def listed(
    wid: str, runs: list[tuple[float, float | None]], submitted: float = 0.0
) -> dict[str, Any]:
    """A workload that ran `runs` ((start, end) each, end None: still running), each attempt
    but a running last one preempted, as the API lists it."""
    record = WorkloadRecord(id=wid, spec=SPEC, submitted_at=submitted)
    for start, end in runs:
        record.lifecycle = lifecycle.place(record.lifecycle, "eu-1", (), start - 1)
        record.lifecycle = lifecycle.start(record.lifecycle, record.epoch, start)
        if end is not None:
            record.lifecycle = lifecycle.end(
                record.lifecycle, record.epoch, EndReason.PREEMPTED, end, record.retry_rules
            )
    return WorkloadOut.of(record, NOW).model_dump(mode="json")


def test_work_that_ran_and_waits_again_counts_what_it_ran() -> None:
    # Preempted (or drained) and queued again: its record's started_at is None now, and
    # it was skipped as never started.
    waiting = listed("w1", [(10.0, 40.0)])
    assert waiting["phase"] == "queued" and waiting["started_at"] is None
    jobs, skipped, _ = to_jobs([waiting], 0.0, NOW)
    assert [(j.id, j.duration) for j in jobs] == [("w1", 30.0)]
    assert not skipped


def test_resumed_work_adds_up_its_attempts_and_restarted_work_is_its_last() -> None:
    record = listed("w1", [(10.0, 40.0), (100.0, 160.0), (200.0, None)])
    assert record["phase"] == "running"
    assert run_time(record, NOW) == 30.0 + 60.0 + 800.0  # the running one until now
    assert run_time(record, NOW, resume=False) == 800.0
    jobs, _, _ = to_jobs([record], 0.0, NOW, resume=False)
    assert jobs[0].duration == 800.0


def test_a_workload_no_attempt_of_which_started_is_skipped() -> None:
    queued = listed("w1", [])
    placed = WorkloadRecord(id="w2", spec=SPEC, submitted_at=0.0)
    placed.lifecycle = lifecycle.place(placed.lifecycle, "eu-1", (), 5.0)
    rows = [queued, WorkloadOut.of(placed, NOW).model_dump(mode="json"), listed("w3", [(1.0, 2.5)])]
    assert run_time(rows[1], NOW) is None
    jobs, skipped, first = to_jobs(rows, 0.0, NOW)
    assert [(j.id, j.duration) for j in jobs] == [("w3", 1.5)]
    assert skipped == {"never_started": 2}
    assert first == 0.0
