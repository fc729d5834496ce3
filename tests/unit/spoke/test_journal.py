"""The spoke journal: what a spoke applied and owes survives a crash, in order, bounded.

The process-level drills (kill -9 of a real spoke mid-run) stay in tests/integration/faults;
here a "crash" is opening the journal again without closing it, as a new process would.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import spoke.journal as journal_module
from schemas import Assignment, EventPhase, WorkloadEvent
from spoke.journal import FINISHED_KEPT, Journal, SpokeState
from tests.support.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "spoke" / "journal.jsonl"


@pytest.fixture
def journal(path: Path) -> Iterator[Journal]:
    opened = Journal(path)
    yield opened
    opened.close()


def event(clock: FakeClock, workload: str, phase: EventPhase, epoch: int = 1) -> WorkloadEvent:
    at = clock.advance(1.5)
    return WorkloadEvent(
        event_id=f"{workload}-{epoch}-{phase.value}-{at:.0f}",
        spoke_id="eu-1",
        workload_id=workload,
        epoch=epoch,
        phase=phase,
        at=at,
    )


GPU0 = (Assignment(node="n0", devices=(0,)),)
GPU1 = (Assignment(node="n0", devices=(1,)),)


def test_a_restarted_spoke_remembers_its_allocations_and_the_events_it_owes(
    journal: Journal, path: Path, clock: FakeClock
) -> None:
    journal.placed("w1", 1, GPU0)
    journal.placed("w2", 3, GPU1)
    journal.applied(7)
    running = event(clock, "w1", EventPhase.RUNNING)
    ended = event(clock, "w2", EventPhase.SUCCEEDED, epoch=3)
    journal.queue_event(running)
    journal.queue_event(ended)
    journal.ended("w2", 3)
    journal.delivered(running.event_id)
    journal.flush()  # the agent flushes before anything it journalled leaves the process

    again = Journal(path)  # the process died; a new one opens the same file
    try:
        assert again.state.allocations == {"w1": (1, GPU0)}
        assert again.state.applied_seq == 7
        assert list(again.state.outbox.values()) == [ended]  # still owed, times as they were
        assert again.state.finished == {"w2": 3}
        assert again.state.epochs == {"w1": 1, "w2": 3}
    finally:
        again.close()


def test_events_are_owed_in_the_order_they_happened(
    journal: Journal, path: Path, clock: FakeClock
) -> None:
    events = [event(clock, f"w{n}", EventPhase.RUNNING) for n in range(20)]
    for e in events:
        journal.queue_event(e)
    journal.close()
    again = Journal(path)
    try:
        owed = list(again.state.outbox.values())
        assert owed == events
        assert [e.at for e in owed] == sorted(e.at for e in owed)
    finally:
        again.close()


def test_a_torn_last_line_loses_only_that_line(path: Path, clock: FakeClock) -> None:
    first = Journal(path)
    first.placed("w1", 1, GPU0)
    first.queue_event(event(clock, "w1", EventPhase.RUNNING))
    first.close()
    with open(path, "a", encoding="utf-8") as f:
        f.write('{"t":"place","w":"w2","e":')  # the machine went down mid-write
    again = Journal(path)
    try:
        assert again.state.allocations == {"w1": (1, GPU0)}
        assert len(again.state.outbox) == 1
    finally:
        again.close()


def test_an_older_epoch_ending_late_keeps_the_newer_allocation(journal: Journal) -> None:
    journal.placed("w1", 1, GPU0)
    journal.placed("w1", 2, GPU1)  # the hub moved it; epoch 1's end arrives afterwards
    journal.ended("w1", 1)
    assert journal.state.allocations == {"w1": (2, GPU1)}
    assert journal.state.epochs["w1"] == 2


def test_a_full_outbox_refuses_and_counts_instead_of_growing(path: Path, clock: FakeClock) -> None:
    small = Journal(path, max_outbox=2)
    try:
        kept = [small.queue_event(event(clock, f"w{n}", EventPhase.RUNNING)) for n in range(3)]
        assert [k is not None for k in kept] == [True, True, False]
        assert json.loads(kept[0] or b"")["workload_id"] == "w0"  # the JSON the hub is sent
        assert len(small.state.outbox) == 2
        assert small.dropped == 1
    finally:
        small.close()


def test_compaction_keeps_the_state_and_shrinks_the_file(
    path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "COMPACT_AFTER_LINES", 50)
    first = Journal(path)
    first.placed("live", 4, GPU1)
    for seq in range(1, 41):  # a long run: commands applied, events sent and acknowledged
        first.applied(seq)
        sent = event(clock, "live", EventPhase.RUNNING, epoch=4)
        first.queue_event(sent)
        first.delivered(sent.event_id)
    owed = event(clock, "live", EventPhase.SUCCEEDED, epoch=4)
    first.queue_event(owed)
    first.close()  # (waits for a compaction under way)
    assert len(path.read_text().splitlines()) < 80  # 122 facts appended, most since compacted
    again = Journal(path)
    try:
        assert again.state.allocations == {"live": (4, GPU1)}
        assert again.state.applied_seq == 40
        assert list(again.state.outbox.values()) == [owed]
    finally:
        again.close()


def test_finished_workloads_are_remembered_up_to_a_bound(journal: Journal) -> None:
    for n in range(FINISHED_KEPT + 5):
        journal.placed(f"w{n}", 1, GPU0)
        journal.ended(f"w{n}", 1)
    assert len(journal.state.finished) == FINISHED_KEPT
    assert "w0" not in journal.state.finished  # the oldest go first
    assert f"w{FINISHED_KEPT + 4}" in journal.state.finished
    assert "w0" not in journal.state.epochs


def _known(s: SpokeState) -> tuple[object, ...]:
    """What a spoke's journal holds that the hub and the spoke rely on."""
    return s.allocations, dict(s.finished), list(s.outbox.values()), s.applied_seq


def _as_replayed(path: Path, scratch: Path) -> tuple[object, ...]:
    """What a spoke started on this file now would know (opened on a copy: opening the file
    itself would compact it under the live journal)."""
    shutil.copyfile(path, scratch)
    again = Journal(scratch)
    try:
        return _known(again.state)
    finally:
        again.close()


def test_a_compaction_on_its_thread_loses_nothing_appended_while_it_runs(
    path: Path, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewrite runs beside the spoke's loop; the file on disk must replay to everything
    flushed at every moment: before the rewrite is in place, and after."""
    monkeypatch.setattr(journal_module, "COMPACT_AFTER_LINES", 40)
    live = Journal(path)
    seen_compacting = facts = 0
    try:
        for n in range(150):
            facts += 3 + (n % 3 != 0) + (n % 4 == 0)
            live.placed(f"w{n}", 1, GPU0 if n % 2 else GPU1)
            live.applied(n + 1)
            running = event(clock, f"w{n}", EventPhase.RUNNING)
            live.queue_event(running)
            if n % 3:
                live.delivered(running.event_id)
            if n % 4 == 0:
                live.ended(f"w{n - 2}", 1)
            seen_compacting += live.compacting
            live.flush()
            assert _as_replayed(path, tmp_path / "replayed.jsonl") == _known(live.state), n
    finally:
        live.close()
    assert seen_compacting > 0  # the steps above ran with a rewrite under way
    assert not path.with_suffix(".tmp").exists()
    assert len(path.read_text().splitlines()) < facts  # compacted: a line per fact no more


def test_a_compaction_that_fails_keeps_the_journal_and_is_tried_again(
    path: Path, tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(journal_module, "COMPACT_AFTER_LINES", 20)
    blocked = path.with_suffix(".tmp")
    blocked.mkdir(parents=True)  # where the rewrite goes cannot be written: as a full disk
    live = Journal(path)
    try:
        for seq in range(1, 31):
            live.applied(seq)
            live.flush()
        for _ in range(1000):  # until the loop has seen the rewrite fail (it never blocks)
            if not live.compacting:
                break
            time.sleep(0.01)
            live.flush()
        assert not live.compacting
        assert len(path.read_text().splitlines()) == 30  # every fact still there
        assert _as_replayed(path, tmp_path / "replayed.jsonl")[3] == 30
        blocked.rmdir()  # the disk has room again: the next rewrite goes through
        for seq in range(31, 101):
            live.applied(seq)
            live.flush()
    finally:
        live.close()
    assert len(path.read_text().splitlines()) < 70  # 100 facts appended, compacted since
    assert _as_replayed(path, tmp_path / "replayed.jsonl")[3] == 100
