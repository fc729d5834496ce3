"""Workloads a test's spokes left running, found by their own files and stopped by PID."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path


def kill_workloads_under(root: Path) -> list[int]:
    """SIGKILL the process group of every local-runtime workload whose exit file lies under
    `root`; the pids of the wrappers killed.

    The local runtime starts each workload as `/bin/sh -c WRAPPER EXIT_FILE ...`, leading its own
    process group, and leaves it running when its spoke stops (a restarted spoke adopts it). A
    test's spokes stop for good at its end, so what they started goes with them: by the exit
    file's path under this test's own folder, never by a command's name. So do their watchdogs
    (spoke.runtime.watchdog, named by their runs journal's path under the folder).
    """
    prefixes = tuple({(str(p) + os.sep).encode() for p in (root, root.resolve())})
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        wrapper = len(argv) > 3 and argv[0] == b"/bin/sh" and argv[3].endswith(b".exit")
        watchdog = len(argv) > 4 and argv[2] == b"spoke.runtime.watchdog"
        if watchdog and argv[4].startswith(prefixes):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
        elif wrapper and argv[3].startswith(prefixes):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
    return killed
