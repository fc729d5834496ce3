"""`gpufed up` stopped by a signal other than Ctrl-C (a service manager's SIGTERM, a closed
terminal's SIGHUP) stops every process it started, as Ctrl-C does: its pieces and the
workloads they run, which live in sessions of their own. Killed outright (SIGKILL, the OOM
killer), it leaves nothing running either, and the next `gpufed up` in its folder starts.

The federation's processes are found by its data dir, which every piece names in its argv and
every workload in its environment (its spoke's state folder): a listing of `gpufed up`'s
children would miss a piece restarted after it, and a workload whose spoke was killed before
it stopped it (reparented to init)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from bus import lifeline
from bus.ports import free_port
from gpufed.client import HubClient
from tests.support.wait import wait_until_sync

READY = "stops everything"  # the line `gpufed up` prints once all its pieces are up
#: What the federation runs once the workload started: NATS, the hub, 3 spokes, burst, and the
#: workload (its wrapper shell and `sleep`); matched in each process's command line.
PIECES = ("nats-server", " hub ", "--id eu-1", "--id eu-2", "--id us-1", " burst ", "sleep 300")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_stops_gpufed_up_and_everything_it_started(
    tmp_path: Path, sig: signal.Signals
) -> None:
    data, port = tmp_path / "data", free_port()
    up = _start_up(data, port)
    try:
        token = (data / "admin.token").read_text().strip()
        client = HubClient(f"http://127.0.0.1:{port}", token=token)
        try:
            client.submit({"name": "long", "team": "t", "command": ["sleep", "300"]})
        finally:
            client.close()
        # Every piece and the workload are found (a piece restarting is found once it is back).
        wait_until_sync(
            lambda: all(p in _command_lines(data) for p in PIECES), 60, "every piece running"
        )

        up.send_signal(sig)
        rest, _ = up.communicate(timeout=120)
        assert up.returncode == 0, rest
        assert "stopping" in rest
        # A piece stopped by its handle is reaped by then; a workload may still be dying.
        _, alive = psutil.wait_procs(_processes(data), timeout=30)
        assert alive == [], _command_lines(data)
    finally:
        if up.poll() is None:  # only if the test failed
            up.kill()
            up.communicate()
        for process in _processes(data):  # only if the test failed: nothing outlives it
            with contextlib.suppress(psutil.Error):
                process.kill()


def test_gpufed_up_killed_outright_leaves_nothing_running_and_starts_again(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    up = _start_up(data, free_port())
    try:
        wait_until_sync(
            lambda: all(p in _command_lines(data) for p in PIECES[:-1]), 60, "every piece running"
        )
        # Burst holds the read end of `gpufed up`'s lifeline, to hand to the cloud spokes it
        # starts: they outlive burst, not `gpufed up` (tests/integration/burst).
        [burst] = [p for p in _processes(data) if " burst " in _command_line(p)]
        handed = burst.environ()[lifeline.ENV]
        assert os.readlink(f"/proc/{burst.pid}/fd/{handed}").startswith("pipe:")
        up.kill()  # no handler runs: each piece hears of it from the kernel
        up.communicate()
        _, alive = psutil.wait_procs(_processes(data), timeout=30)
        assert alive == [], _command_lines(data)
        again = _start_up(data, free_port())  # no piece of the first holds its folder
        again.send_signal(signal.SIGTERM)
        rest, _ = again.communicate(timeout=120)
        assert again.returncode == 0, rest
    finally:
        for process in _processes(data):  # only if the test failed: nothing outlives it
            with contextlib.suppress(psutil.Error):
                process.kill()


def _start_up(data: Path, port: int) -> subprocess.Popen[str]:
    """`gpufed up` in `data`, once it printed that all its pieces are up."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    up = subprocess.Popen(
        [sys.executable, "-m", "gpufed", "up", "--data-dir", str(data), "--api-port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=env,
        text=True,
    )
    assert up.stdout is not None
    seen = []
    for line in up.stdout:
        seen.append(line)
        if READY in line:
            return up
    up.wait()
    pytest.fail(f"gpufed up ended before it was ready: {''.join(seen)}")


def _processes(root: Path) -> list[psutil.Process]:
    """The live processes of the federation under `root` (by argv or environment)."""
    mark = str(root)
    found = []
    for process in psutil.process_iter():
        try:
            if mark in _command_line(process) or any(mark in v for v in process.environ().values()):
                found.append(process)
        except psutil.Error:  # ended since it was listed (zombies too), or not ours to read
            continue
    return found


def _command_line(process: psutil.Process) -> str:
    return " ".join(process.cmdline())


def _command_lines(root: Path) -> str:
    lines = []
    for process in _processes(root):
        try:
            lines.append(_command_line(process))
        except psutil.Error:
            continue
    return "\n".join(lines)
