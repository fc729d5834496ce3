"""Exit codes of a local runtime's wrappers, one appended line per process, in a shared file.

A wrapper started as the spoke's own user records how its command ended so that a restarted
spoke learns the exit code of a run that ended while no spoke process was its parent. It used
to write a file of its own per process; a file creation is the dearest thing a start does on
some file systems (18-800 µs of CPU each on the development machine's ext4, by the minute,
against 5 µs on tmpfs), and a living spoke never reads that file: it has the code from
`waitpid`. So the wrappers append `<key> <code>` to one file instead (`O_APPEND`: one short
write each, whole, whatever runs beside it), which costs an open, not a creation.

The file comes in generations (`exits-<n>.txt`): a spoke process starts a new one, and a new
one again every `ROTATE_AFTER` starts. A run records its generation in `runs.jsonl`; a
generation's file is removed once no run that names it is open and it is not the current one,
so the files hold a bounded number of lines whatever the spoke runs. Only the spoke's own user
writes here: a workload started as another user (`run_as`) keeps an exit file of its own, made
the user's, since a shared file it could write would let it forge another run's end.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

#: Starts a generation's file takes before the next start opens a new one (about 3 MB).
ROTATE_AFTER = 100_000
_PREFIX, _SUFFIX = "exits-", ".txt"


class ExitLog:
    """The generations of one runtime's exit-code file in `run_dir` (the folder must exist
    before the first `begin`)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._open: dict[int, int] = {}  # generation -> runs open that name it
        self._current: int | None = None
        self._started = 0  # starts in the current generation
        self._read: dict[int, tuple[int, dict[str, int]]] = {}  # gen -> (offset, codes)

    def path(self, generation: int) -> str:
        return f"{self.run_dir}{os.sep}{_PREFIX}{generation}{_SUFFIX}"

    def begin(self) -> int:
        """The generation a new run's wrappers append to (counted open until `end`)."""
        if self._current is None or self._started >= ROTATE_AFTER:
            previous = self._current
            self._current = max([*self._on_disk(), *self._open, -1]) + 1
            self._started = 0
            # Made by the spoke, once: a wrapper appending to a missing file would make it
            # itself, with the wrapper's umask.
            os.close(os.open(self.path(self._current), os.O_CREAT | os.O_WRONLY, 0o600))
            if previous is not None:
                self._forget_if_done(previous)
        self._started += 1
        self._open[self._current] = self._open.get(self._current, 0) + 1
        return self._current

    def adopted(self, generation: int) -> None:
        """A run a previous spoke process started, still open, names `generation`."""
        self._open[generation] = self._open.get(generation, 0) + 1

    def end(self, generation: int) -> None:
        """A run that named `generation` ended (its end is in runs.jsonl)."""
        left = self._open.get(generation, 0) - 1
        if left > 0:
            self._open[generation] = left
            return
        self._open.pop(generation, None)
        self._forget_if_done(generation)

    def prune(self) -> None:
        """Remove the files of generations no open run names (a previous life's)."""
        for generation in self._on_disk():
            if generation not in self._open and generation != self._current:
                self._remove(generation)

    def code(self, generation: int, key: str) -> int | None:
        """The exit code a wrapper appended for `key` to `generation`'s file, if any."""
        offset, codes = self._read.get(generation, (0, {}))
        try:
            with open(self.path(generation), "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return None
        complete = data.rfind(b"\n") + 1  # a line being written is read next time
        for line in data[:complete].splitlines():
            name, _, value = line.decode(errors="replace").rpartition(" ")
            with contextlib.suppress(ValueError):
                codes[name] = int(value)
        self._read[generation] = (offset + complete, codes)
        return codes.get(key)

    def _forget_if_done(self, generation: int) -> None:
        if generation != self._current and generation not in self._open:
            self._remove(generation)

    def _remove(self, generation: int) -> None:
        self._read.pop(generation, None)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path(generation))

    def _on_disk(self) -> list[int]:
        found = []
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(self.run_dir):
                number = name[len(_PREFIX) : -len(_SUFFIX)]
                if name.startswith(_PREFIX) and name.endswith(_SUFFIX) and number.isdigit():
                    found.append(int(number))
        return found
