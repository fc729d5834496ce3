"""Local processes as the local runtime sees them: alive or not, found by their command line,
and what their exit code means."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

#: How long what is left of a workload's process groups, once its wrapper has ended, gets to
#: end before it is killed (a TERM trap writing its last line, a child finishing).
LEFTOVER_GRACE_S = 2.0


def exit_file(run_prefix: str, workload_id: str, epoch: int, rank: int) -> str:
    """The exit file of one rank of a run (its wrapper's $0: how /proc finds the wrapper)."""
    return f"{run_prefix}{workload_id}-e{epoch}-r{rank}.exit"


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


async def until_groups_end(groups: Sequence[int], grace_s: float = LEFTOVER_GRACE_S) -> None:
    """Return once no process is left in the process groups `groups` (each led by one of a
    workload's wrappers); what is still there after `grace_s` is killed.

    A wrapper's end is not its workload's: killed by a stop's TERM, it goes at once while the
    command it ran (its own group member) may still be finishing, a TERM trap for instance.
    The workload's devices are free, and its end may be reported, only once all of it is gone:
    else the hub starts it again elsewhere while it still runs here.
    """
    deadline = time.monotonic() + grace_s
    killed = False
    while left := [g for g in groups if _group_alive(g)]:
        if time.monotonic() >= deadline:
            if killed:  # zombies nobody reaps (an orphan's parent that never waits): gone
                return
            for group in left:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
            killed, deadline = True, time.monotonic() + 1.0
        await asyncio.sleep(0.01)


def _group_alive(group: int) -> bool:
    """Whether a process other than a zombie is left in process group `group`."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # members of another user's (run_as): still there
        pass
    # Zombies count for kill(): an orphan's zombie waits for its new parent to reap it.
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                    if int(fields[2]) == group and fields[0] != "Z":
                        return True
        return False
    return True  # no /proc (not Linux): kill() is all we can know


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
