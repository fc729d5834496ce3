"""The rule for how long an ended workload's files stay on its spoke."""

from __future__ import annotations

from spoke.runtime.retention import EndedRuns, Keep, Leftover


def _ids(leftovers: list[Leftover]) -> list[str]:
    return [item.workload_id for item in leftovers]


def test_files_go_once_old_enough_or_once_more_than_the_count_ended_oldest_first() -> None:
    runs = EndedRuns(Keep(seconds=100, count=2))
    for n, wid in enumerate(("a", "b", "c")):
        runs.ended(wid, 1, at=float(n))
    assert _ids(runs.due(now=50)) == ["a"]  # three kept, two allowed
    assert runs.due(now=50) == []
    assert _ids(runs.due(now=101)) == ["b"]  # ended at 1: 100 s ago
    assert _ids(runs.due(now=102)) == ["c"]
    assert len(runs) == 0


def test_a_workload_started_again_keeps_its_files_and_loses_every_epoch_together() -> None:
    runs = EndedRuns(Keep(seconds=10, count=5))
    runs.ended("w", 1, at=0)
    runs.started("w")  # requeued to this spoke: live again
    assert runs.due(now=1000) == []
    runs.ended("w", 2, at=1000)
    assert runs.due(now=1005) == []  # kept from its last end
    assert runs.due(now=1010) == [Leftover("w", frozenset({1, 2}))]


def test_what_an_earlier_spoke_left_is_older_than_what_ended_since_and_merges_with_it() -> None:
    runs = EndedRuns(Keep(seconds=1000, count=2))
    runs.ended("new", 3, at=500)
    runs.started("back")  # found on disk below, running again now
    runs.found([(1.0, "old", 1), (2.0, "old", None), (3.0, "new", 2), (4.0, "back", 1)])
    assert runs.due(now=600) == []  # two kept: old and new
    runs.ended("back", 2, at=700)
    assert runs.due(now=700) == [Leftover("old", frozenset({1}))]
    assert runs.due(now=1500) == [Leftover("new", frozenset({2, 3}))]
    assert runs.due(now=1700) == [Leftover("back", frozenset({1, 2}))]


def test_a_count_of_zero_keeps_nothing_that_ended() -> None:
    runs = EndedRuns(Keep(seconds=1e9, count=0))
    runs.ended("w", 1, at=0)
    assert _ids(runs.due(now=0)) == ["w"]


def test_the_rule_reads_as_a_person_writes_it() -> None:
    assert Keep().describe() == "for 7 days, the last 10000 at most"
    assert Keep(3600, 5).describe() == "for 1 hour, the last 5 at most"
    assert Keep(90, 1).describe() == "for 90 seconds, the last 1 at most"
