"""The NATS credentials of burst's instances: minted at launch, renewed at half their lifetime
where the provider can hand a new one to a running instance, revoked when an instance ends.

A revocation that fails (the bus is away) is retried every round until it holds.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from burst.errors import BurstError
from burst.ports import CredentialIssuer, Provisioner
from schemas.burst import InstanceState

log = structlog.get_logger(__name__)


class InstanceCredentials:
    """Keeps each burst instance's credential in step with the instance's life."""

    def __init__(
        self, issuer: CredentialIssuer | None, provider: Provisioner, ttl_s: float
    ) -> None:
        self.issuer = issuer  # None: the bus has no auth, instances get no credential
        self.provider = provider
        self.ttl_s = ttl_s
        self._minted: dict[str, float] = {}  # when each live instance's credential was minted
        self._unrevoked: set[str] = set()  # ended instances whose credential may still work

    def mint(self, burst_id: str, now: float) -> str | None:
        """The new instance's creds text (None without an issuer)."""
        if self.issuer is None:
            return None
        self._minted[burst_id] = now
        return self.issuer.mint(burst_id, now)

    async def ended(self, burst_ids: list[str], now: float) -> None:
        """These instances ended (released, failed, gone): revoke their credentials."""
        for burst_id in burst_ids:
            self._minted.pop(burst_id, None)
            self._unrevoked.add(burst_id)
        await self.revoke_pending(now)

    async def revoke_pending(self, now: float) -> None:
        """Revoke what still needs it; on failure keep it for the next round."""
        if self.issuer is None or not self._unrevoked:
            return
        ids = sorted(self._unrevoked)
        try:
            await self.issuer.revoke(ids, now)
        except Exception as exc:
            log.warning("burst_revoke_failed", burst_ids=ids, error=str(exc))
            return
        self._unrevoked.difference_update(ids)

    async def renew_due(self, states: Mapping[str, InstanceState], now: float) -> None:
        """Renew the credentials of live instances at half their lifetime, where the provider
        can (`renew_credentials`: the local provider rewrites the creds file and the spoke
        reconnects with it). Elsewhere a credential lives its TTL."""
        renew = getattr(self.provider, "renew_credentials", None)
        if self.issuer is None or renew is None:
            return
        for burst_id, state in sorted(states.items()):
            if state not in (InstanceState.REQUESTED, InstanceState.RUNNING):
                continue
            minted = self._minted.get(burst_id)
            if minted is not None and now - minted < self.ttl_s / 2:
                continue
            try:
                await renew(burst_id, self.issuer.mint(burst_id, now))
            except BurstError as exc:
                log.warning("burst_credential_renew_failed", burst_id=burst_id, error=exc.message)
                continue
            self._minted[burst_id] = now
