"""The spoke's memory across restarts: an append-only journal of what it applied and owes.

One JSON line per fact: a placement applied, a workload ended, an event queued for the hub, an
event delivered. Replaying it rebuilds the state; it is rewritten compactly when it grows. Lines
are buffered and flushed to the OS (`flush`) before anything they describe leaves the process,
so a killed spoke process loses nothing anyone heard of; with `fsync` (the spoke's
`journal_fsync` setting) each flush also waits for the disk, else a machine crash may lose the
last lines, which reconciliation with the hub repairs.

The rewrite runs on a thread beside the event loop: on the loop, serialising and syncing its
~4,000 lines held every start behind it for 15-21 ms at 400 starts/s (longer when the disk is
busy: it ends in an fsync); now the loop only copies the state (~3 ms) and puts the new file in
place (~1 ms). The thread writes the copy to a new file; lines appended meanwhile go to the
journal as always and are kept too; once the copy is on disk they are added to it and it
replaces the journal, so the file on disk replays to everything flushed at every moment.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from schemas import Assignment, WorkloadEvent

log = structlog.get_logger(__name__)

#: Workloads remembered as finished (for reconciliation and fencing late duplicates).
FINISHED_KEPT = 2000
#: The journal is compacted when it has this many lines.
COMPACT_AFTER_LINES = 20_000


@dataclass
class SpokeState:
    epochs: dict[str, int] = field(default_factory=dict)  # highest epoch applied per workload
    allocations: dict[str, tuple[int, tuple[Assignment, ...]]] = field(default_factory=dict)
    finished: OrderedDict[str, int] = field(default_factory=OrderedDict)  # workload -> epoch
    outbox: OrderedDict[str, WorkloadEvent] = field(default_factory=OrderedDict)
    applied_seq: int = 0


class Journal:
    """Append-only state journal of one spoke (not safe for two processes at once)."""

    def __init__(self, path: Path, max_outbox: int = 100_000, fsync: bool = False) -> None:
        self.path = path
        self.max_outbox = max_outbox
        self.fsync = fsync
        self._dirty = False
        self.state = SpokeState()
        self.dropped = 0
        self._lines = 0
        self._rewrite: _Rewrite | None = None  # a compaction under way on its thread
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            self._replay()
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    @property
    def compacting(self) -> bool:
        """A rewrite is under way (started, not yet in place)."""
        return self._rewrite is not None

    def close(self) -> None:
        self.flush()
        if self._rewrite is not None:  # a clean stop leaves the rewrite in place
            self._rewrite.thread.join()
            self._finish_rewrite()  # (before the file it adds to is closed)
        self._file.close()

    # --- facts ---

    # The lines of every workload are written as text, not through json.dumps of a dict:
    # a few of them per workload, and the spoke's CPU per workload is what limits a bulk.

    def placed(self, workload_id: str, epoch: int, assignments: tuple[Assignment, ...]) -> None:
        self._apply_placed(workload_id, epoch, assignments)
        listed = ",".join(a.model_dump_json() for a in assignments)
        self._write(
            f'{{"t":"place","w":{json.dumps(workload_id)},"e":{int(epoch)},"a":[{listed}]}}\n'
        )

    def ended(self, workload_id: str, epoch: int) -> None:
        self._apply_ended(workload_id, epoch)
        self._write(f'{{"t":"end","w":{json.dumps(workload_id)},"e":{int(epoch)}}}\n')

    def applied(self, seq: int) -> None:
        if seq > self.state.applied_seq:
            self.state.applied_seq = seq
            self._write(f'{{"t":"seq","s":{int(seq)}}}\n')

    def queue_event(self, event: WorkloadEvent) -> bytes | None:
        """Keep an event until the hub has it; its JSON, or None (and a log) when the outbox
        is full."""
        if len(self.state.outbox) >= self.max_outbox:
            self.dropped += 1
            log.error(
                "event_outbox_full",
                path=str(self.path),
                pending=len(self.state.outbox),
                dropped=self.dropped,
                workload=event.workload_id,
                phase=event.phase.value,
            )
            return None
        self.state.outbox[event.event_id] = event
        payload = event.model_dump_json()
        self._write('{"t":"event","v":' + payload + "}\n")
        return payload.encode()

    def delivered(self, event_id: str) -> None:
        if self.state.outbox.pop(event_id, None) is not None:
            self._write(f'{{"t":"sent","id":{json.dumps(event_id)}}}\n')

    # --- replay and compaction ---

    def _replay(self) -> None:
        with open(self.path, encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                try:
                    self._apply_line(json.loads(line))
                except (ValueError, KeyError, TypeError) as exc:
                    # A torn last line after a crash: keep what came before it.
                    log.warning(
                        "journal_line_skipped", path=str(self.path), line=number, error=str(exc)
                    )
                self._lines = number
        log.info(
            "journal_replayed",
            path=str(self.path),
            allocations=len(self.state.allocations),
            pending_events=len(self.state.outbox),
        )
        self._compact()

    def _apply_line(self, rec: dict[str, Any]) -> None:
        kind = rec["t"]
        if kind == "place":
            assignments = tuple(Assignment.model_validate(a) for a in rec["a"])
            self._apply_placed(rec["w"], rec["e"], assignments)
        elif kind == "end":
            self._apply_ended(rec["w"], rec["e"])
        elif kind == "seq":
            self.state.applied_seq = max(self.state.applied_seq, rec["s"])
        elif kind == "event":
            event = WorkloadEvent.model_validate(rec["v"])
            self.state.outbox[event.event_id] = event
        elif kind == "sent":
            self.state.outbox.pop(rec["id"], None)

    def _apply_placed(self, wid: str, epoch: int, assignments: tuple[Assignment, ...]) -> None:
        self.state.epochs[wid] = max(epoch, self.state.epochs.get(wid, -1))
        self.state.allocations[wid] = (epoch, assignments)

    def _apply_ended(self, wid: str, epoch: int) -> None:
        current = self.state.allocations.get(wid)
        if current is not None and current[0] == epoch:
            del self.state.allocations[wid]
        self.state.finished[wid] = epoch
        self.state.finished.move_to_end(wid)
        while len(self.state.finished) > FINISHED_KEPT:
            old, _ = self.state.finished.popitem(last=False)
            if old not in self.state.allocations:
                self.state.epochs.pop(old, None)

    def flush(self) -> None:
        """Hand what was appended to the OS (and to the disk, if `fsync`).

        The agent calls this before anything leaves the process (an event, a heartbeat, an
        ack, a started process): what others learn of is never ahead of the journal.
        """
        if self._dirty:
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            self._dirty = False
        if self._rewrite is not None and self._rewrite.done:
            self._finish_rewrite()

    def _write(self, line: str) -> None:
        self._file.write(line)
        self._dirty = True
        self._lines += 1
        rewrite = self._rewrite
        if rewrite is not None:
            rewrite.since.append(line)
            if rewrite.done:
                self._finish_rewrite()
        elif self._lines >= COMPACT_AFTER_LINES:
            self._start_rewrite()

    def _start_rewrite(self) -> None:
        """Compact on a thread: the state as it is now (copied: the loop goes on changing it)
        written to a new file."""
        s = self.state
        copy = SpokeState(
            finished=OrderedDict(s.finished),
            allocations=dict(s.allocations),
            outbox=OrderedDict(s.outbox),
            applied_seq=s.applied_seq,
        )
        self._rewrite = _Rewrite(self.path.with_suffix(".tmp"), copy)
        self._rewrite.thread.start()

    def _finish_rewrite(self) -> None:
        """The rewrite is on disk: add what was appended since, and put it in place."""
        rewrite, self._rewrite = self._rewrite, None
        assert rewrite is not None
        error = rewrite.error
        if error is None:
            try:
                with open(rewrite.tmp, "a", encoding="utf-8") as f:
                    f.writelines(rewrite.since)
                    f.flush()
                    if self.fsync:
                        os.fsync(f.fileno())
                os.replace(rewrite.tmp, self.path)
            except OSError as exc:
                error = str(exc)
        if error is not None:  # (a full disk): the journal as it is stays; later again
            log.warning("journal_compaction_failed", path=str(self.path), error=error)
            with contextlib.suppress(OSError):
                os.unlink(rewrite.tmp)
            self._lines = len(rewrite.since)
            return
        self._file.close()  # the journal replaced: what it still buffered is in the new one
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        self._dirty = False
        self._lines = rewrite.lines + len(rewrite.since)

    def _compact(self) -> None:
        """Rewrite the journal as the current state only (atomically), here and now."""
        rewrite = _Rewrite(self.path.with_suffix(".tmp"), self.state)
        rewrite.run()
        if rewrite.error is not None:
            raise OSError(rewrite.error)
        os.replace(rewrite.tmp, self.path)
        self._lines = rewrite.lines


@dataclass
class _Rewrite:
    """One compaction: `state` written to `tmp` (and synced), by `run`."""

    tmp: Path
    state: SpokeState
    since: list[str] = field(default_factory=list)  # lines appended to the journal meanwhile
    lines: int = 0
    error: str | None = None
    done: bool = False  # set by the thread last (read by the loop without a lock: one flag)
    thread: threading.Thread = field(init=False)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.run, name=f"compact-{self.tmp}", daemon=True)

    def run(self) -> None:
        s = self.state
        try:
            lines: list[dict[str, Any]] = [{"t": "seq", "s": s.applied_seq}]
            for wid, epoch in s.finished.items():
                lines.append({"t": "place", "w": wid, "e": epoch, "a": []})
                lines.append({"t": "end", "w": wid, "e": epoch})
            for wid, (epoch, assignments) in s.allocations.items():
                lines.append({"t": "place", "w": wid, "e": epoch, "a": _dump(assignments)})
            lines += [{"t": "event", "v": e.model_dump(mode="json")} for e in s.outbox.values()]
            with open(self.tmp, "w", encoding="utf-8") as f:
                f.writelines(json.dumps(rec, separators=(",", ":")) + "\n" for rec in lines)
                f.flush()
                os.fsync(f.fileno())
            self.lines = len(lines)
        except Exception as exc:  # handed to the loop, which keeps the journal as it is
            self.error = str(exc) or repr(exc)
        finally:
            self.done = True


def _dump(assignments: tuple[Assignment, ...]) -> list[dict[str, Any]]:
    return [a.model_dump(mode="json") for a in assignments]


__all__ = ["Journal", "SpokeState"]
