"""Shared test set-up: structured logs to stderr (quiet unless a test fails), markers by folder."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from gpufed import logs

# No cached loggers: tests that run `gpufed` commands in-process configure structlog again, and
# a logger cached under an earlier configuration would escape structlog.testing.capture_logs.
os.environ["GPUFED_LOG_CACHE"] = "0"
logs.configure(sys.stderr, json=False, level="warning")

_TESTS = Path(__file__).parent


@pytest.fixture(autouse=True)
def _logs_as_configured_here() -> Iterator[None]:
    """Each test starts with the set-up above: a test that runs `gpufed hub` in-process points
    structlog at its captured stderr, which pytest closes when the test ends (the next test to
    log then failed with "I/O operation on closed file")."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


#: A test is marked after every folder it sits in: `pytest -m faults` and the like select by
#: where a test lives, and no file has to remember to mark itself.
MARKS_BY_FOLDER: dict[str, tuple[str, ...]] = {
    "integration": ("integration",),
    "kubernetes": ("kubernetes", "integration"),  # against the Kubernetes API emulator
    "slurm": ("slurm",),  # tests/slurm: real munged, slurmctld and slurmd (root); unit: parsers
    "burst": ("burst",),
    "faults": ("faults",),
    "windows": ("windows",),  # time windows in the policy
    "sessions": ("sessions",),  # interactive sessions, idle culling, idle GPUs
    "services": ("services",),  # inference services: replicas, autoscaling, gateway
    "prometheus": ("prometheus", "integration"),  # Debian's promtool and prometheus
    "browser": ("browser", "integration"),  # Debian's chromium
    "security": ("security",),
}


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM (a CI runner's timeout, `kill`, `timeout`) stops the run as Ctrl-C does: pytest
    then tears down what the running tests set up, so every server they started is stopped by
    its handle. Left to its default, SIGTERM ended pytest on the spot and its nats-server,
    PostgreSQL and daemons ran on."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    # The stream logs went to is pytest's capture, closed before the teardown that follows
    # ends: a piece logging as it stops would raise there and cut the teardown short.
    logs.configure(sys.__stderr__, json=False, level="warning")
    raise KeyboardInterrupt


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folders = item.path.relative_to(_TESTS).parts[:-1]
        for name in sorted({m for folder in folders for m in MARKS_BY_FOLDER.get(folder, ())}):
            item.add_marker(name)
