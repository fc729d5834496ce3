"""Remove what ended workloads left on a spoke's disk, by the rule of spoke.runtime.retention.

An ended workload left its log (one per epoch, `<log_dir>/<id>-e<epoch>.log`) and, on the
local runtime, its workspace (`<work_dir>/<id>`, when it named no working_dir) and the load
file it may have written (`<load_dir>/<id>.load`); a Slurm spoke's jobs leave only logs. A
spoke finds on start what an earlier process of it left, then removes every `SWEEP_S` what is
due. A workspace is first renamed out of the way on the event loop (so a workload started
again meanwhile makes a fresh one, and a large one never holds the loop) and then removed
with the logs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
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
#: A workspace being removed: `<work_dir>/.removing-<id>` (a crash mid-removal leaves it).
REMOVING = ".removing-"
#: Removals between two turns of the event loop for the rest of the spoke.
PER_TURN = 200


class Leftovers:
    """Which ended workloads' files a local runtime keeps, and their removal when due."""

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

    def started(self, workload_id: str) -> None:
        self.ended_runs.started(workload_id)

    def ended(self, workload_id: str, epoch: int) -> None:
        self.ended_runs.ended(workload_id, epoch, time.time())

    def watch(self) -> None:
        """Find what an earlier spoke process left, then sweep until `close`."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="leftovers")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        found, removing = await asyncio.to_thread(self._scan)
        self.ended_runs.found(found)
        if removing:
            await asyncio.to_thread(_remove, [], removing)
        while True:
            await self.sweep()
            await asyncio.sleep(self._sweep_s)

    async def sweep(self) -> int:
        """Remove the files of the workloads now due; for how many workloads."""
        due = self.ended_runs.due(time.time())
        live = self._live()
        logs: list[str] = []
        workspaces: list[str] = []
        removed = 0
        for leftover in due:
            if leftover.workload_id in live:  # started again here after its files were found
                continue
            workspaces += self._set_aside(leftover)
            logs += (self._log_path(leftover, epoch) for epoch in leftover.epochs)
            removed += 1
            if removed % PER_TURN == 0:
                await asyncio.sleep(0)
        if removed:
            await asyncio.to_thread(_remove, logs, workspaces)
            log.info("ended_workloads_removed", workloads=removed, kept=len(self.ended_runs))
        return removed

    def _set_aside(self, leftover: Leftover) -> list[str]:
        """Take the leftover's workspace out of the way of a new start (renamed) and remove
        its load file; the renamed workspace, if it had one."""
        wid = leftover.workload_id
        if self._work_dir is None:
            return []
        aside = f"{self._work_dir}{os.sep}{REMOVING}{wid}"
        try:
            if self._load_dir is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f"{self._load_dir}{os.sep}{wid}.load")
            os.rename(f"{self._work_dir}{os.sep}{wid}", aside)
        except FileNotFoundError:
            return []
        except OSError as exc:  # not ours to remove, say: the next leftover is all the same
            log.warning("ended_workspace_not_removed", workload=wid, error=str(exc))
            return []
        return [aside]

    def _log_path(self, leftover: Leftover, epoch: int) -> str:
        return f"{self._log_dir}{os.sep}{leftover.workload_id}-e{epoch}.log"

    def _scan(self) -> tuple[list[tuple[float, str, int | None]], list[str]]:
        """What is on disk of workloads not running here, as (time, workload, epoch) in the
        order of time; and the workspaces a removal left half done."""
        live = self._live()
        found: list[tuple[float, str, int | None]] = []
        removing: list[str] = []
        for entry in _entries(self._log_dir):
            stem, _, epoch = entry.name.removesuffix(".log").rpartition("-e")
            if entry.name.endswith(".log") and stem and epoch.isdigit() and stem not in live:
                found.append((_mtime(entry), stem, int(epoch)))
        for entry in _entries(self._work_dir):
            if entry.name.startswith(REMOVING):
                removing.append(entry.path)
            elif entry.is_dir(follow_symlinks=False) and entry.name not in live:
                found.append((_mtime(entry), entry.name, None))
        for entry in _entries(self._load_dir):
            wid = entry.name.removesuffix(".load")
            if entry.name.endswith(".load") and wid and wid not in live:
                found.append((_mtime(entry), wid, None))
        found.sort(key=lambda item: item[0])
        return found, removing


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


def _remove(logs: list[str], workspaces: list[str]) -> None:
    """In a worker thread: the logs and the workspaces set aside. A failure is logged and the
    sweep goes on: a file this spoke may not remove must not stop the rest."""
    for path in logs:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("ended_log_not_removed", path=path, error=str(exc))
    for path in workspaces:
        try:
            os.rmdir(path)  # most are empty: a fifth of what rmtree costs
        except OSError:
            shutil.rmtree(path, onerror=_not_removed)  # `onexc` from Python 3.12


def _not_removed(
    _function: object, path: str, exc_info: tuple[object, BaseException, object]
) -> None:
    log.warning("ended_workspace_not_removed", path=path, error=str(exc_info[1]))
