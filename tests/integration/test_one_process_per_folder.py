"""One process per state folder: a second `gpufed spoke` on a spoke's state dir, a second
`gpufed hub` on a SQLite store or a second `gpufed up` in one folder is refused at once, naming
the first one's pid, instead of running workloads twice or tearing their files; the folder is
free again once the first is gone, however it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bus.ports import free_port
from gpufed.dirlock import FolderLock

pytestmark = pytest.mark.integration

_HOLD = (
    "import sys; from pathlib import Path; from gpufed.dirlock import FolderLock; "
    "FolderLock(Path(sys.argv[1]), 'test', sys.argv[2]).take(); print('held', flush=True); "
    "sys.stdin.read()"
)


Hold = Callable[..., "subprocess.Popen[str]"]


@pytest.fixture
def hold() -> Iterator[Hold]:
    """Holds a folder's lock from another process, as a running piece would."""
    held: list[subprocess.Popen[str]] = []

    def start(folder: Path, name: str = ".lock") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(folder), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        held.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc

    try:
        yield start
    finally:
        for proc in held:
            proc.kill()
            proc.wait(10)


def _gpufed(*argv: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it; it must give up at once, not serve."""
    nowhere = f"nats://127.0.0.1:{free_port()}"  # never reached: the folder is checked first
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpufed",
            *argv,
            *(("--nats-url", nowhere) if argv[0] != "up" else ()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_second_spoke_hub_or_up_on_a_folder_in_use_is_refused_naming_the_first(
    tmp_path: Path, hold: Hold
) -> None:
    state = tmp_path / "spokes"
    first = hold(state / "eu-1")
    done = _gpufed("spoke", "--id", "eu-1", "--region", "eu", "--state-dir", str(state))
    assert done.returncode == 1
    assert f"gpufed spoke: {state / 'eu-1'} is in use by another spoke eu-1 (pid {first.pid})" in (
        done.stderr
    )

    data = tmp_path / "hub"
    first = hold(data)
    done = _gpufed("hub", "--data-dir", str(data), "--api-port", str(free_port()))
    assert done.returncode == 1
    assert f"is in use by another hub on this SQLite store (pid {first.pid})" in done.stderr

    folder = tmp_path / ".gpufed"
    first = hold(folder)
    done = _gpufed("up", "--data-dir", str(folder), "--api-port", str(free_port()))
    assert done.returncode == 1
    assert f"is in use by another gpufed up (pid {first.pid})" in done.stderr
    assert not (folder / "nats").exists()  # refused before starting anything


def test_the_folder_is_free_once_its_holder_is_killed(tmp_path: Path, hold: Hold) -> None:
    first = hold(tmp_path)
    with pytest.raises(RuntimeError, match=f"pid {first.pid}"):
        FolderLock(tmp_path, "spoke eu-1").take()
    os.kill(first.pid, signal.SIGKILL)
    first.wait(10)
    lock = FolderLock(tmp_path, "spoke eu-1").take()  # the kernel let go of the dead one's
    lock.release()
    assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
