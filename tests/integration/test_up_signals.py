"""`gpufed up` stopped by a signal other than Ctrl-C (a service manager's SIGTERM, a closed
terminal's SIGHUP) stops every process it started, as Ctrl-C does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bus.natsserver import free_port

READY = "stops everything"  # the line `gpufed up` prints once all its pieces are up


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_stops_gpufed_up_and_everything_it_started(
    tmp_path: Path, sig: signal.Signals
) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    where = ["--data-dir", str(tmp_path / "data"), "--api-port", str(free_port())]
    up = subprocess.Popen(
        [sys.executable, "-m", "gpufed", "up", *where],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    children: list[psutil.Process] = []
    try:
        assert up.stdout is not None
        seen = []
        for line in up.stdout:
            seen.append(line)
            if READY in line:
                break
        else:
            pytest.fail(f"gpufed up ended before it was ready: {''.join(seen)}")
        children = psutil.Process(up.pid).children(recursive=True)
        names = " ".join(_cmdline(c) for c in children)
        assert "nats-server" in names and " hub" in names and " spoke" in names

        up.send_signal(sig)
        rest, _ = up.communicate(timeout=120)
        assert up.returncode == 0, rest
        assert "stopping" in rest
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], [_cmdline(p) for p in alive]
    finally:
        if up.poll() is None:  # only if the test failed
            up.kill()
            up.communicate()
        for child in children:  # only if the test failed: nothing of ours outlives it
            if child.is_running():
                child.kill()


def _cmdline(process: psutil.Process) -> str:
    """Its command line; empty for one that has ended since it was listed (a piece restarting)."""
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:  # zombies too
        return ""
