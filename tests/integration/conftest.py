"""Fixtures that start real servers on free loopback ports and stop them by their handles."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from bus.natsserver import EmbeddedNats
from tests.integration.fed import InProcessFederation


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def fed(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[InProcessFederation]:
    federation = InProcessFederation(nats_server.url, tmp_path)
    try:
        yield federation
    finally:
        await federation.close()
