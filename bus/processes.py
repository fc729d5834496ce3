"""Child processes stopped by their own handle: a signal, a grace period, then SIGKILL.

One routine for every process we start (nats-server, the pieces of `gpufed up`, test servers),
so that none is left running and none is stopped by name.
"""

from __future__ import annotations

import signal
import subprocess


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
