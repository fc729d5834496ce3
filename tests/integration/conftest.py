"""Fixtures that start real servers on free loopback ports and stop them by their handles."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import pytest

from bus.authority import NatsAuthority
from bus.natsserver import EmbeddedNats
from gpufed.up import Federation, SimSpoke
from tests.integration.databases import db_url, engine, pg_url, postgres, store  # noqa: F401
from tests.integration.fed import InProcessFederation


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def secure_nats(tmp_path: Path) -> Iterator[EmbeddedNats]:
    """A nats-server in operator mode: every client needs a credential of its authority."""
    authority = NatsAuthority.open(tmp_path / "nats-authority", int(time.time()))
    server = EmbeddedNats(tmp_path / "secure-nats", authority=authority).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def fed(secure_nats: EmbeddedNats, tmp_path: Path) -> AsyncIterator[InProcessFederation]:
    """Hub and spokes in this loop, each with its own confined credential, as `gpufed up`."""
    federation = InProcessFederation(secure_nats.url, tmp_path, authority=secure_nats.authority)
    try:
        yield federation
    finally:
        await federation.close()


class MakeFederation(Protocol):
    """Builds a `gpufed up` federation of real processes with NATS started; stopped after."""

    def __call__(self, fleet: tuple[SimSpoke, ...], **kwargs: Any) -> Federation: ...


MakeClient = Callable[[Federation], httpx.AsyncClient]


@pytest.fixture
def make_fed(tmp_path: Path) -> Iterator[MakeFederation]:
    made: list[Federation] = []

    def make(fleet: tuple[SimSpoke, ...], **kwargs: Any) -> Federation:
        fed = Federation(tmp_path / "fed", api_port=0, fleet=fleet, **kwargs)
        fed.log_dir.mkdir(parents=True, exist_ok=True)
        fed.nats.start()
        made.append(fed)
        return fed

    yield make
    for fed in made:
        fed.stop()


@pytest.fixture
async def api() -> AsyncIterator[MakeClient]:
    """REST clients of a federation's hub, closed after the test."""
    clients: list[httpx.AsyncClient] = []

    def make(fed: Federation) -> httpx.AsyncClient:
        client = httpx.AsyncClient(
            base_url=fed.api_url,
            timeout=5,
            headers={"Authorization": f"Bearer {fed.admin_token}"},
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
