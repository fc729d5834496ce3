"""The hub's per-batch info lines: at most one a second, and what they held back counted."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import structlog

from bus.loglines import LineThrottle
from gpufed import logs
from hub import transitions
from hub.audit import LISTED_MAX, log_written
from hub.authstore import AuditEntry
from hub.core.lifecycle import EndReason
from hub.records import WorkloadRecord
from schemas import Assignment, WorkloadSpec


def test_a_line_a_second_and_the_items_of_those_held_back() -> None:
    lines = LineThrottle(every_s=1.0)
    assert lines.allow(10.0, 3) == 0  # the first line goes out
    assert lines.allow(10.2, 4) is None  # held back, its 4 items counted
    assert lines.allow(10.9, 1) is None
    assert lines.allow(11.0, 2) == 5  # a second on: out, with the 5 held back
    assert lines.allow(11.5, 1) is None
    assert lines.allow(30.0, 1) == 1


@pytest.fixture
def info_lines() -> Iterator[None]:
    logs.configure(sys.stderr, json=False, level="info")
    yield
    logs.configure(sys.stderr, json=False, level="warning")  # as tests/conftest.py leaves it


def finished(name: str) -> WorkloadRecord:
    w = WorkloadRecord(
        id=name, spec=WorkloadSpec(name=name, team="ml", command=["true"]), submitted_at=1.0
    )
    transitions.place(w, "eu-1", (Assignment(node="n0", devices=(0,)),), 2.0)
    transitions.end(w, EndReason.SUCCEEDED, 3.0, "", 0)
    return w


@pytest.mark.usefixtures("info_lines")
def test_finished_workloads_log_at_most_a_line_a_second() -> None:
    lines = LineThrottle(every_s=1.0)
    with structlog.testing.capture_logs() as logs:
        transitions.log_finished([finished("a")], lines, 100.0)
        transitions.log_finished([finished("b"), finished("c")], lines, 100.5)  # held back
        transitions.log_finished([finished("d")], lines, 101.0)
    assert [
        (e["event"], e.get("workload"), e.get("workloads"), e.get("unlisted")) for e in logs
    ] == [
        ("workload_finished", "a", None, None),
        ("workloads_finished", None, ["d:succeeded:0"], 2),
    ]


@pytest.mark.usefixtures("info_lines")
def test_without_a_throttle_every_batch_logs() -> None:
    with structlog.testing.capture_logs() as logs:
        transitions.log_finished([finished("a")])
        transitions.log_finished([finished("b")])
    assert [e["workload"] for e in logs] == ["a", "b"]


@pytest.mark.usefixtures("info_lines")
def test_a_batch_of_thousands_logs_a_line_that_lists_twenty_and_counts_the_rest() -> None:
    """A batch submission writes an audit entry per workload (the store keeps them all); its
    log line lists the first LISTED_MAX, not 10,000 entries on one line."""
    entries = [
        AuditEntry(
            at=1.0,
            actor="ci",
            role="member",
            action="submit",
            team="ml",
            target=f"w{i}",
            result="ok",
        )
        for i in range(1000)
    ]
    with structlog.testing.capture_logs() as logs:
        log_written(entries, unlisted=5)
    [line] = logs
    assert (line["count"], len(line["entries"]), line["unlisted"]) == (1000, LISTED_MAX, 985)
    assert line["entries"][0] == "ci submit ml w0 ok"
