"""Local processes as the local runtime sees them: alive or not, found by their command line,
and what their exit code means."""

from __future__ import annotations

import contextlib
import os
import signal
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
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if wanted.intersection(argv):
                found.append(int(entry.name))
    return sorted(found)


def alive(pid: int, workload_id: str) -> bool:
    """Is `pid` a live (not zombie) process of this workload? Guards against pid reuse."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] == "Z":
            return False
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        return f"GPUFED_WORKLOAD_ID={workload_id}".encode() in environ.split(b"\0")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (not Linux): existence is all we can know
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


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
