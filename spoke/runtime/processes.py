"""Local processes as the local runtime sees them: alive or not, found by their command line,
and what their exit code means."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def find_wrappers(exit_files: list[str]) -> list[int]:
    """Pids of the live wrappers whose command line names one of `exit_files` (Linux /proc)."""
    wanted = {path.encode() for path in exit_files}
    found = []
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                argv = _proc_read(int(entry.name), "cmdline").split(b"\0")
            except OSError:
                continue
            if wanted.intersection(argv):
                found.append(int(entry.name))
    return sorted(found)


def alive(pid: int, workload_id: str) -> bool:
    """Is `pid` a live (not zombie) process of this workload? Guards against pid reuse."""
    try:
        if _state(pid) == "Z":
            return False
        environ = _proc_read(pid, "environ")
        return f"GPUFED_WORKLOAD_ID={workload_id}".encode() in environ.split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): existence is all we can know
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


#: A kernel thread's flag in /proc/PID/stat: it never has a command line or environment.
_PF_KTHREAD = 0x00200000


def _proc_read(pid: int, name: str) -> bytes:
    """/proc/PID/NAME (cmdline, environ), waiting out an exec in progress.

    A process shows an empty command line and environment for a moment while it execs: a
    spawn returns before the new program's arguments are in place, so a spoke killed right
    after one (and restarted at once) could read them empty.
    """
    path = Path(f"/proc/{pid}/{name}")
    for _ in range(50):
        data = path.read_bytes()
        if data:
            return data
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == "Z" or int(fields[6]) & _PF_KTHREAD:
            return data
        time.sleep(0.01)
    return data


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def end_reason(exit_code: int | None) -> str:
    if exit_code is None:
        return "exit_unknown"
    if exit_code == 127:
        return "command_not_found"
    if exit_code == 126:
        return "not_executable"
    return signal_name(exit_code) if exit_code < 0 else "exit_code"


def signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal_{-code}"
