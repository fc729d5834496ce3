"""Replay metrics on tiny cases computed by hand."""

from __future__ import annotations

import pytest

from gpufed.replay import metrics
from gpufed.replay.cloud import Instance
from gpufed.replay.metrics import Window
from gpufed.replay.simulator import Outcome
from gpufed.replay.traces import Job
from schemas.burst import Market


def job(i: int, submit: float, duration: float = 10.0, gpus: int = 1, team: str = "a") -> Job:
    return Job(f"j{i}", submit, duration, team, 1, gpus)


def test_window_runs_from_the_10th_to_the_90th_percent_arrival() -> None:
    submits = [float(t) for t in range(0, 100, 10)]  # 10 jobs at 0, 10, ..., 90
    assert metrics.steady_window(submits) == Window(0.0, 80.0)  # 1st and 9th arrivals
    assert metrics.steady_window([float(t) for t in range(20)]) == Window(1.0, 17.0)


def test_window_falls_back_to_the_arrival_span_when_empty() -> None:
    assert metrics.steady_window([5.0, 5.0, 5.0]) == Window(5.0, 5.0)
    assert metrics.steady_window([]) == Window(0.0, 0.0)


def test_utilization_counts_only_on_prem_gpu_time_inside_the_window() -> None:
    jobs = [job(0, 0, gpus=2), job(1, 0, gpus=4), job(2, 0, gpus=8)]
    outcome = Outcome(jobs, 8, [0.0, 0.0, 0.0], [100.0, 100.0, 100.0])
    outcome.segments = [
        (0.0, 100.0, 0, False),  # 2 GPUs, 50 s inside [50, 150)
        (120.0, 200.0, 1, False),  # 4 GPUs, 30 s inside
        (60.0, 140.0, 2, True),  # on a cloud spoke: not on-prem utilisation
    ]
    assert metrics.utilization(outcome, Window(50.0, 150.0)) == pytest.approx(
        (2 * 50 + 4 * 30) / (8 * 100)
    )


def test_jct_and_wait_use_completion_and_first_start() -> None:
    jobs = [job(0, 0), job(1, 10), job(2, 20)]
    outcome = Outcome(jobs, 1, [0.0, 30.0, None], [10.0, 60.0, None])
    assert sorted(metrics.jcts(outcome)) == [10.0, 50.0]
    assert sorted(metrics.waits(outcome)) == [0.0, 20.0]
    assert metrics.summary(metrics.jcts(outcome)) == {"avg": 30.0, "p50": 30.0, "p99": 49.6}


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert metrics.percentile(values, 50) == pytest.approx(50.5)
    assert metrics.percentile(values, 99) == pytest.approx(99.01)
    assert metrics.percentile([], 50) is None


def test_team_stats_and_finish_time_fairness_against_the_isolated_run() -> None:
    jobs = [job(0, 0, team="a"), job(1, 0, team="a"), job(2, 0, team="b", gpus=2)]
    shared = Outcome(jobs, 4, [0.0, 0.0, 0.0], [10.0, 20.0, 10.0])
    shared.segments = [(0.0, 10.0, 0, False), (10.0, 20.0, 1, False), (0.0, 10.0, 2, False)]
    alone = Outcome(jobs, 4, [0.0, 10.0, 0.0], [10.0, 40.0, 5.0])
    stats = metrics.team_stats(shared, Window(0.0, 20.0), {"a": 2.0, "c": 1.0}, alone)
    a, b, c = stats["a"], stats["b"], stats["c"]
    assert (a["jobs"], a["finished"], a["avg_jct_s"]) == (2, 2, 15.0)
    assert a["avg_gpus_held"] == pytest.approx(1.0)  # 20 GPU-s over 20 s
    assert a["finish_time_fairness"] == pytest.approx(30.0 / 50.0)  # better off sharing
    assert b["finish_time_fairness"] == pytest.approx(2.0)  # 10 s shared, 5 s alone
    assert b["guarantee_gpus"] == 0.0 and b["gpu_hours"] == pytest.approx(20 / 3600)
    assert c["jobs"] == 0 and c["avg_jct_s"] is None and c["guarantee_gpus"] == 1.0


def test_cloud_cost_bills_from_launch_to_termination() -> None:
    used = Instance("i1", "a", "g.x", "us-east-1", Market.SPOT, 3.6, "A10G", 4, 0.0)
    used.terminated_at, used.placed = 1800.0, 2
    idle = Instance("i2", "a", "g.x", "us-east-1", Market.SPOT, 3.6, "A10G", 4, 1000.0)
    stats = metrics.cloud_stats([used, idle], until=4600.0)  # idle one still live at the end
    assert stats["instances"] == 2 and stats["unused_instances"] == 1
    assert stats["cost"] == pytest.approx(3.6 * 0.5 + 3.6 * 1.0)
    assert stats["gpu_hours"] == pytest.approx(4 * 0.5 + 4 * 1.0)


def test_usage_series_spreads_gpu_time_over_bins() -> None:
    jobs = [job(0, 0, gpus=2)]
    outcome = Outcome(jobs, 4, [0.0], [150.0])
    outcome.segments = [(50.0, 150.0, 0, False)]
    outcome.finished_at = 200.0
    mids, onprem, cloud = metrics.usage_series(outcome, bins=4)
    assert mids == [25.0, 75.0, 125.0, 175.0]
    assert onprem == [0.0, 2.0, 2.0, 0.0]
    assert cloud == [0.0] * 4


def test_bounded_slowdown_is_jct_over_run_time_at_least_ten_seconds() -> None:
    jobs = [job(0, 0, duration=100.0), job(1, 0, duration=2.0), job(2, 0, duration=50.0)]
    # 100 s job waits 100 s: 2; 2 s job waits 18 s: 20 s / 10 s = 2; 50 s job never ends.
    outcome = Outcome(jobs, 1, [100.0, 18.0, 0.0], [200.0, 20.0, None])
    assert metrics.bounded_slowdowns(outcome) == [2.0, 2.0]
    # A 1 s job that ran at once has slowdown 1, not 0.1.
    quick = Outcome([job(0, 0, duration=1.0)], 1, [0.0], [1.0])
    assert metrics.bounded_slowdowns(quick) == [1.0]


def test_wide_waits_count_only_jobs_of_32_gpus_or_more() -> None:
    jobs = [
        Job("gang", 0.0, 10.0, "a", 4, 8),
        Job("half", 0.0, 10.0, "a", 2, 8),
        Job("small", 0.0, 10.0, "a", 1, 1),
    ]
    outcome = Outcome(jobs, 64, [300.0, 200.0, 5.0], [310.0, 210.0, 15.0])
    assert metrics.wide_waits(outcome) == [300.0]
