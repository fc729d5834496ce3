"""Debian's prometheus package: promtool for the config and rules, the server for a live scrape."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def debian_tool(name: str) -> str:
    """The path of `name` from Debian's prometheus package; skip loudly when it is missing."""
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        pytest.skip(
            f"SKIPPED: {name} not found - install Debian's prometheus package "
            "(apt-get install prometheus) to run the Prometheus tests"
        )
    return path


@pytest.fixture
def promtool() -> str:
    return debian_tool("promtool")


@pytest.fixture
def prometheus_bin() -> str:
    return debian_tool("prometheus")
