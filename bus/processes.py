"""Child processes stopped by their own handle: a signal, a grace period, then SIGKILL.

One routine for every process we start (nats-server, the pieces of `gpufed up`, test servers),
so that none is left running and none is stopped by name.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable

#: prctl(2) option: the signal this process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def stop_process(
    proc: subprocess.Popen[bytes], grace_s: float = 10.0, sig: int = signal.SIGTERM
) -> int:
    """Send `sig`, wait up to `grace_s`, then SIGKILL; return the exit status.

    A process that has already exited is only reaped. Safe to call twice.
    """
    if proc.poll() is None:
        proc.send_signal(sig)
    return _reap(proc, grace_s)


def stop_processes(procs: list[subprocess.Popen[bytes]], grace_s: float = 10.0) -> None:
    """SIGTERM them all first, then reap each: the graces run side by side, not in a row."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        _reap(proc, grace_s)


def _reap(proc: subprocess.Popen[bytes], grace_s: float) -> int:
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def ends_with_us() -> Callable[[], None] | None:
    """A `preexec_fn` for Popen: the child gets SIGTERM when this process dies, even by
    SIGKILL, so nothing we start outlives us (Linux's PR_SET_PDEATHSIG; None elsewhere).

    The kernel ties it to the *thread* that starts the child: use it from a thread that lives
    as long as the process (the main thread). prctl is looked up here, in the parent; the
    child only calls it, and ends at once if we died before it could.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent, sigterm = os.getpid(), int(signal.SIGTERM)

    def tie() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sigterm)

    return tie
