"""The local runtime's record of what it started (runs.jsonl), for a restarted spoke.

One line per start (written, and handed to the OS, before the first process exists), one with
the pids once they exist, one with a relay's port, one per end. A restarted spoke replays it to
find the runs that were started and not ended, and rewrites it to just those.

Only the start and the end lines are flushed as they are written: the start because a spoke
killed right after the spawn must still find its processes (it looks them up by their exit
files' paths in /proc when the pids line is missing), the end because what holds its exit
codes (its exit files, or its share of an exit log: spoke.runtime.exitlog) may go right
after. The pids and port lines ride along with the next flush.

The lines of the runs still open are kept in memory too: once the file holds
`COMPACT_AFTER_LINES` lines it is rewritten to just those at the next end (a start line
carries the whole spec, so a spoke that ran a million short jobs would otherwise keep a file
of about a gigabyte, and read all of it on its next start).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any, TextIO

import structlog

from spoke.ports import Launch

log = structlog.get_logger(__name__)

#: The file is rewritten to the open runs' lines when it has this many lines.
COMPACT_AFTER_LINES = 20_000


class RunJournal:
    """Append-only runs.jsonl of one local runtime (one open handle, lines buffered)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO | None = None
        self._open: dict[tuple[str, int], list[str]] = {}  # each open run's lines, in order
        self._lines = 0  # in the file

    def start(self, launch: Launch, port: int | None, exits: int | None = None) -> None:
        """The start of `launch` (flushed: before any of its processes exists); `exits`: the
        exit log generation its wrappers append to (spoke.runtime.exitlog), if any."""
        # Spec and assignments serialised by pydantic straight to JSON text: this line is
        # written for every start, and a dict round trip through json.dumps costs more.
        head = json.dumps(
            {
                "t": "start",
                "workload_id": launch.workload_id,
                "epoch": launch.epoch,
                "decision_id": launch.decision_id,
                "pids": [],
                "port": port,
                "x": exits,
            },
            separators=(",", ":"),
        )
        assignments = ",".join(a.model_dump_json() for a in launch.assignments)
        spec = launch.spec.model_dump_json()
        line = f'{head[:-1]},"spec":{spec},"assignments":[{assignments}]}}\n'
        self._open[(launch.workload_id, launch.epoch)] = [line]
        self._write(line, flush=True)

    def pids(self, launch: Launch, pids: list[int]) -> None:
        """Its processes' pids (buffered: /proc finds them by their exit files if lost)."""
        w, e = json.dumps(launch.workload_id), launch.epoch
        self._note(launch, f'{{"t":"pids","w":{w},"e":{e},"pids":{json.dumps(pids)}}}\n')

    def port(self, launch: Launch, public_port: int | None) -> None:
        """Where its relay listens (buffered: a lost one means a new port on adoption)."""
        w, e, pub = json.dumps(launch.workload_id), launch.epoch, json.dumps(public_port)
        self._note(launch, f'{{"t":"port","w":{w},"e":{e},"pub":{pub}}}\n')

    def end(self, launch: Launch) -> None:
        """Its end (flushed: what holds its exit codes may be removed next)."""
        w, e = json.dumps(launch.workload_id), launch.epoch
        self._open.pop((launch.workload_id, launch.epoch), None)
        if self._lines + 1 >= COMPACT_AFTER_LINES:
            self._compact()  # (the end is in it: the run is no longer there)
        else:
            self._write(f'{{"t":"end","w":{w},"e":{e}}}\n', flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def replay(self) -> list[dict[str, Any]]:
        """The start records (with their pids and port) of runs started and not ended; the
        file is rewritten to just those."""
        self.close()
        if not self.path.exists():
            return []
        open_runs = read_open(self.path)
        lines = [json.dumps(r) + "\n" for r in open_runs.values()]
        self._open = {
            (r["workload_id"], int(r["epoch"])): [line]
            for r, line in zip(open_runs.values(), lines, strict=True)
        }
        self._rewrite(lines)
        return list(open_runs.values())

    def _note(self, launch: Launch, line: str) -> None:
        """A buffered line about an open run."""
        lines = self._open.get((launch.workload_id, launch.epoch))
        if lines is not None:
            lines.append(line)
        self._write(line, flush=False)

    def _compact(self) -> None:
        """Rewrite the file as the open runs' lines (atomically)."""
        self.close()
        self._rewrite([line for lines in self._open.values() for line in lines])

    def _rewrite(self, lines: list[str]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with _private(tmp, os.O_TRUNC) as f:
            f.writelines(lines)
        os.replace(tmp, self.path)
        self._lines = len(lines)

    def _write(self, line: str, *, flush: bool) -> None:
        # One open append handle: files are slow to open here.
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = _private(self.path, os.O_APPEND)
        self._file.write(line)
        self._lines += 1
        if flush:
            self._file.flush()


def read_open(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """The start records (with their pids and port) of the runs in `path` started and not
    ended, by (workload id, epoch); the file is only read (the spoke's watchdog reads it)."""
    open_runs: dict[tuple[str, int], dict[str, Any]] = {}
    with contextlib.suppress(FileNotFoundError):
        text = path.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            try:
                record = json.loads(line)
                if record["t"] == "start":
                    open_runs[(record["workload_id"], int(record["epoch"]))] = record
                elif record["t"] in ("pids", "port"):
                    started = open_runs.get((record["w"], int(record["e"])))
                    if started is not None and record["t"] == "pids":
                        started["pids"] = record["pids"]
                    elif started is not None:
                        started["pub"] = record["pub"]
                else:
                    open_runs.pop((record["w"], int(record["e"])), None)
            except (ValueError, KeyError, TypeError) as exc:  # a torn last line
                log.warning("run_journal_line_skipped", line=number, error=str(exc))
    return open_runs


def _private(path: Path, how: int) -> TextIO:
    """`path` opened for writing (`how`: os.O_APPEND or os.O_TRUNC), readable by the spoke's
    user only: its lines hold workloads' specs, secret env values included, and the folder
    stays searchable for `run_as` workloads. A file an older spoke made wider is narrowed."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | how, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "a" if how == os.O_APPEND else "w", encoding="utf-8")
