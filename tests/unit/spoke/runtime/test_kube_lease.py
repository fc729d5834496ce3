"""The deadline a fenced Kubernetes Job carries: the spoke's lease, from the Job's start."""

from __future__ import annotations

from spoke.runtime.kubernetes.lease import (
    active_deadline,
    fenced_by_lease,
    renewed,
    start_time_of,
)

START = 1_000.0


def test_the_deadline_is_whole_seconds_from_the_start_rounded_down_and_capped() -> None:
    assert active_deadline(START + 109.9, START, None) == 109  # never a moment late
    assert active_deadline(START + 109.9, START, 60) == 60  # the workload's own limit first
    assert active_deadline(START - 5, START, None) == 1  # run out: at once (the API's least)


def test_a_deadline_is_raised_only_near_its_end_and_lowered_at_once() -> None:
    # Set to 50 s from the start; the lease now reaches 120 s from it.
    far, near = START + 10, START + 40
    assert renewed(50, START, START + 120, None, far, renew_within_s=20) is None
    assert renewed(50, START, START + 120, None, near, renew_within_s=20) == 120
    # The lease came closer than the Job's deadline: lowered whatever the time.
    assert renewed(50, START, START + 30, None, far, renew_within_s=20) == 30
    # Nothing to change: at the lease already, or held by the workload's max runtime.
    assert renewed(120, START, START + 120.5, None, START + 110, renew_within_s=20) is None
    assert renewed(60, START, START + 120, 60, START + 55, renew_within_s=20) is None
    # A Job given none yet (the hub was not heard when it started) gets one.
    assert renewed(None, START, START + 120, None, far, renew_within_s=20) == 120


def test_a_jobs_start_is_its_start_time_else_its_creation() -> None:
    started = {"status": {"startTime": "2026-12-07T08:00:05Z"}}
    created = {"metadata": {"creationTimestamp": "2026-12-07T08:00:04Z"}, "status": {}}
    assert start_time_of(started) == 1796630405.0
    assert start_time_of(created) == 1796630404.0
    assert start_time_of({"status": {"startTime": "soon"}}) is None
    assert start_time_of({}) is None


def test_a_job_past_its_deadline_was_fenced_only_below_its_max_runtime() -> None:
    def job(deadline: int, **annotations: str) -> dict[str, object]:
        return {
            "metadata": {"annotations": annotations},
            "spec": {"activeDeadlineSeconds": deadline},
        }

    fenced = {"gpufed.io/fenced": "true"}
    assert fenced_by_lease(job(90, **fenced))
    assert fenced_by_lease(job(90, **fenced, **{"gpufed.io/max-runtime-s": "7200"}))
    assert not fenced_by_lease(job(7200, **fenced, **{"gpufed.io/max-runtime-s": "7200"}))
    assert not fenced_by_lease(job(90))  # not under a lease: its own max runtime
