"""Instance credentials follow the instance: minted, renewed at half-life, revoked at the end."""

from __future__ import annotations

from typing import Any

import pytest

from burst.credentials import InstanceCredentials
from schemas.burst import InstanceState

pytestmark = pytest.mark.security


class Issuer:
    """A CredentialIssuer that records what it was asked; revocation fails while `down`."""

    def __init__(self) -> None:
        self.minted: list[tuple[str, float]] = []
        self.revoked: list[str] = []
        self.down = False

    def mint(self, spoke_id: str, now: float) -> str:
        self.minted.append((spoke_id, now))
        return f"creds-{spoke_id}-{now:g}"

    async def revoke(self, spoke_ids: list[str], now: float) -> None:
        if self.down:
            raise OSError("NATS is away")
        self.revoked += spoke_ids


class RenewingProvider:
    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    async def renew_credentials(self, burst_id: str, creds: str) -> None:
        self.files[burst_id] = creds


async def test_renewed_at_half_life_and_revoked_once_the_bus_answers() -> None:
    issuer, provider = Issuer(), RenewingProvider()
    credentials = InstanceCredentials(issuer, provider, ttl_s=100)  # type: ignore[arg-type]
    assert credentials.mint("b-1", 0.0) == "creds-b-1-0"
    live: dict[str, Any] = {"b-1": InstanceState.RUNNING}

    await credentials.renew_due(live, 49.0)
    assert provider.files == {}  # not yet half its life
    await credentials.renew_due(live, 50.0)
    assert provider.files == {"b-1": "creds-b-1-50"}
    await credentials.renew_due({"b-1": InstanceState.TERMINATING}, 200.0)
    assert provider.files == {"b-1": "creds-b-1-50"}  # a leaving instance gets none

    issuer.down = True
    await credentials.ended(["b-1"], 210.0)
    assert issuer.revoked == []
    issuer.down = False
    await credentials.revoke_pending(212.0)  # the next round
    await credentials.revoke_pending(214.0)
    assert issuer.revoked == ["b-1"]  # once, after the bus came back


async def test_without_an_issuer_nothing_is_minted() -> None:
    credentials = InstanceCredentials(None, RenewingProvider(), ttl_s=100)  # type: ignore[arg-type]
    assert credentials.mint("b-1", 0.0) is None
    await credentials.ended(["b-1"], 1.0)
