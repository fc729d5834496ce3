"""Remove what ended workloads left on a spoke's disk, by the rule of spoke.runtime.retention.

An ended workload left its log (one per epoch, `<log_dir>/<id>-e<epoch>.log`) and, on the
local runtime, its workspace (`<work_dir>/<id>`, when it named no working_dir) and the load
file it may have written (`<load_dir>/<id>.load`); a Slurm spoke's jobs leave only logs. A
spoke finds on start what an earlier process of it left, then removes every `SWEEP_S` what is
due, in a worker thread: the event loop only picks what goes. A workload started again here
while its files are being removed waits for that removal (`settled`) before its start makes
its workspace, so it never starts in a folder that is going.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable, Container
from pathlib import Path

import structlog

from spoke.runtime.retention import EndedRuns, Keep, Leftover

log = structlog.get_logger(__name__)

#: Seconds between sweeps (a spoke at 400 ends a second keeps 4,000 more than its count).
SWEEP_S = 10.0

Found = list[tuple[float, str, int | None]]  # (modification time, workload id, epoch or None)


def log_name(workload_id: str, epoch: int) -> str:
    """The file name of a workload's log for one epoch, in every runtime that keeps logs."""
    return f"{workload_id}-e{epoch}.log"


def log_of(name: str) -> tuple[str, int] | None:
    """The workload and epoch a `log_name` holds; None: not a workload's log."""
    stem, _, epoch = name.removesuffix(".log").rpartition("-e")
    if name.endswith(".log") and stem and epoch.isdigit():
        return stem, int(epoch)
    return None


class Leftovers:
    """Which ended workloads' files a runtime keeps, and their removal when due."""

    def __init__(
        self,
        keep: Keep,
        log_dir: Path,
        work_dir: Path | None,
        load_dir: Path | None,
        live: Callable[[], Container[str]],
        sweep_s: float = SWEEP_S,
    ) -> None:
        self.ended_runs = EndedRuns(keep)
        self._log_dir, self._work_dir, self._load_dir = log_dir, work_dir, load_dir
        self._live = live  # the workloads running here now, whose files always stay
        self._sweep_s = sweep_s
        self._task: asyncio.Task[None] | None = None
        self._removing: frozenset[str] = frozenset()  # whose files the worker thread removes
        self._removal: asyncio.Future[None] | None = None

    def started(self, workload_id: str) -> None:
        self.ended_runs.started(workload_id)

    def ended(self, workload_id: str, epoch: int) -> None:
        self.ended_runs.ended(workload_id, epoch, time.time())

    def removing(self, workload_id: str) -> bool:
        """Whether `workload_id`'s files are being removed now (a start waits: `settled`)."""
        return workload_id in self._removing

    async def settled(self) -> None:
        """Until the removal under way, if any, has ended."""
        if self._removal is not None:
            await asyncio.shield(self._removal)

    def watch(self) -> None:
        """Find what an earlier spoke process left, then sweep until `close`."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="leftovers")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await asyncio.gather(self.settled(), return_exceptions=True)

    async def _run(self) -> None:
        self.ended_runs.found(await asyncio.to_thread(self._scan))
        while True:
            await self.sweep()
            await asyncio.sleep(self._sweep_s)

    async def sweep(self) -> int:
        """Remove the files of the workloads now due; for how many workloads."""
        await self.settled()  # one removal at a time
        live = self._live()
        due = [x for x in self.ended_runs.due(time.time()) if x.workload_id not in live]
        if not due:
            return 0
        removal = asyncio.ensure_future(asyncio.to_thread(self._remove, due))
        self._removing, self._removal = frozenset(x.workload_id for x in due), removal
        removal.add_done_callback(self._removed)  # also when this sweep is cancelled
        await asyncio.shield(removal)
        log.info("ended_workloads_removed", workloads=len(due), kept=len(self.ended_runs))
        return len(due)

    def _removed(self, _removal: asyncio.Future[None]) -> None:
        self._removing, self._removal = frozenset(), None

    def _remove(self, due: list[Leftover]) -> None:
        """In a worker thread: each leftover's logs, load file and workspace. A failure is
        logged and the sweep goes on: a file this spoke may not remove must not stop the rest."""
        logs, work, load = f"{self._log_dir}{os.sep}", self._work_dir, self._load_dir
        for leftover in due:
            wid = leftover.workload_id
            paths = [logs + log_name(wid, epoch) for epoch in leftover.epochs]
            if load is not None:
                paths.append(f"{load}{os.sep}{wid}.load")
            for path in paths:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    log.warning("ended_file_not_removed", path=path, error=str(exc))
            if work is not None:
                _remove_workspace(f"{work}{os.sep}{wid}")

    def _scan(self) -> Found:
        """What is on disk of workloads not running here, as (time, workload, epoch) in the
        order of time."""
        live = self._live()
        found: Found = []
        for entry in _entries(self._log_dir):
            named = log_of(entry.name)
            if named is not None and named[0] not in live:
                found.append((_mtime(entry), *named))
        for entry in _entries(self._work_dir):
            if entry.is_dir(follow_symlinks=False) and entry.name not in live:
                found.append((_mtime(entry), entry.name, None))
        for entry in _entries(self._load_dir):
            wid = entry.name.removesuffix(".load")
            if entry.name.endswith(".load") and wid and wid not in live:
                found.append((_mtime(entry), wid, None))
        found.sort(key=lambda item: item[0])
        return found


def _remove_workspace(path: str) -> None:
    try:
        os.rmdir(path)  # most are empty: a fifth of what rmtree costs
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(path, onerror=_not_removed)  # `onexc` from Python 3.12


def _entries(folder: Path | None) -> list[os.DirEntry[str]]:
    if folder is None:
        return []
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except FileNotFoundError:
        return []


def _mtime(entry: os.DirEntry[str]) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return 0.0  # gone meanwhile: due at once, and its removal finds nothing


def _not_removed(
    _function: object, path: str, exc_info: tuple[object, BaseException, object]
) -> None:
    log.warning("ended_workspace_not_removed", path=path, error=str(exc_info[1]))
