"""Cost per 1,000 requests from replica GPU time and its price."""

from __future__ import annotations

import pytest

from hub.core.servicecost import ReplicaRun, cost_per_1k_requests, gpu_dollars


def test_cost_per_thousand_requests_is_gpu_time_times_price_over_requests() -> None:
    runs = [ReplicaRun(1.0, 0, 3600, 2.0), ReplicaRun(0.5, 1800, None, 4.0)]
    seconds, dollars = gpu_dollars(runs, now=3600)
    assert seconds == pytest.approx(3600 + 900)
    assert dollars == pytest.approx(2.0 + 1.0)
    assert cost_per_1k_requests(dollars, 6000) == pytest.approx(0.5)


def test_no_request_no_figure() -> None:
    assert cost_per_1k_requests(5.0, 0) is None
