"""A test run stopped by SIGTERM (a CI runner's timeout, `kill`) stops what its tests started."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.wait import wait_until_sync

_ROOT = Path(__file__).parents[2]
_CHILD = Path(__file__).with_name("sigterm_child.py")


def _alive(pid: int, run_dir: Path) -> bool:
    """Whether `pid` is a running nats-server of `run_dir`'s tests (not a zombie, ended but
    not yet reaped; not another process that got its pid since)."""
    proc = Path(f"/proc/{pid}")
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv = (proc / "cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError):
        return False
    return state != "Z" and any(str(run_dir).encode() in arg for arg in argv)


@pytest.mark.parametrize("serving", [False, True], ids=["idle", "while-the-api-serves"])
def test_a_test_run_stopped_by_sigterm_stops_the_servers_its_tests_started(
    tmp_path: Path, serving: bool
) -> None:
    pid_file = tmp_path / "nats.pid"
    env = {**os.environ, "SIGTERM_CHILD_PID_FILE": str(pid_file)}
    if serving:
        env["SIGTERM_CHILD_SERVE"] = "1"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(_CHILD)]
    run_dir = tmp_path / "run"
    command += ["--basetemp", str(run_dir)]
    with (tmp_path / "run.log").open("wb") as log:
        run = subprocess.Popen(command, cwd=_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    nats_pid = None
    try:
        wait_until_sync(lambda: pid_file.exists() and pid_file.stat().st_size > 0, 60, "its run")
        nats_pid = int(pid_file.read_text())
        assert _alive(nats_pid, run_dir)
        run.send_signal(signal.SIGTERM)
        code = run.wait(60)
        output = (tmp_path / "run.log").read_text()
        assert code == pytest.ExitCode.INTERRUPTED, output
        # The fixture stopped its nats-server by its handle before pytest exited.
        assert not _alive(nats_pid, run_dir), (
            f"nats-server {nats_pid} outlived its test run:\n{output}"
        )
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if nats_pid is not None and _alive(nats_pid, run_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(nats_pid, signal.SIGKILL)
