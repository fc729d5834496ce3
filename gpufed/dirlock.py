"""One process per state folder.

A spoke's journal and runs, and a hub's SQLite store, are each written by one process: a second
`gpufed spoke` on the same state dir and id would start the same workloads again and tear the
journal, a second `gpufed hub` on one SQLite file would lead beside the first and place work
twice, a second `gpufed up` in one folder would do both. Each takes `<folder>/.lock` (an
exclusive `flock`, released by the kernel when its process ends, however it ends, so a piece
restarted after a crash finds it free) and a second one is refused, naming the first's pid.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

LOCK_NAME = ".lock"


class FolderBusy(RuntimeError):
    """Another live process holds the folder."""


class FolderLock:
    """`<folder>/<name>` (`.lock`), held from `take()` until `release()` or the process's
    end."""

    def __init__(self, folder: Path, what: str, name: str = LOCK_NAME) -> None:
        self.path = folder / name
        self.what = what
        self._fd: int | None = None

    def take(self) -> FolderLock:
        """Hold the folder (made if missing); raises FolderBusy if a live process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise FolderBusy(
                f"{self.path.parent} is in use by another {self.what} (pid {holder}): stop it "
                "first, or give this one a folder of its own"
            ) from None
        except OSError as exc:  # a file system without locks (some NFS mounts): go on, warned
            os.close(fd)
            log.warning("folder_not_locked", folder=str(self.path.parent), error=str(exc))
            return self
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # the flock goes with the last descriptor of its open file
