"""Per-instance NATS credentials for burst spokes: minted at launch, revoked at release.

A burst instance's spoke gets a user JWT of the GPUFED account confined to its own spoke id's
subjects (bus.identities.spoke_permissions) that expires `ttl_s` after minting. Releasing the
instance revokes it: the account JWT is re-signed with a revocation for that user and pushed to
the server's resolver (`$SYS.REQ.ACCOUNT.<account>.CLAIMS.UPDATE`), which closes the user's
connections at once and refuses it from then on, also after a server restart.

The user key is derived from the spoke id and the account signing key (HMAC), so a restarted
controller can revoke what an earlier run minted without keeping a list. `push_revocations` is
also how `gpufed nats-authority revoke` reaches the hub's servers.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nkeys
import structlog
from nats.aio.client import RawCredentials

from bus import jwt, natsclient
from bus.authority import Issued, mint
from bus.identities import spoke_permissions
from bus.jwt import KeyPair
from bus.tls import client_context

log = structlog.get_logger(__name__)

#: Default lifetime of an instance credential; an instance released earlier is revoked.
DEFAULT_TTL_S = 12 * 3600


class IssuerError(RuntimeError):
    """A credential could not be minted or revoked (retry later: the bus may be away)."""


class InstanceIssuer:
    """Mints and revokes burst spokes' credentials with the issuer file (see NatsAuthority)."""

    def __init__(
        self,
        issuer_file: Path,
        nats_url: str,
        *,
        ttl_s: int = DEFAULT_TTL_S,
        tls_ca: str | None = None,
    ) -> None:
        data = json.loads(Path(issuer_file).read_text(encoding="utf-8"))
        self.account: str = data["account"]
        self._account_signer = KeyPair(data["account_signer"])
        self._operator_signer = KeyPair(data["operator_signer"])
        self._system_creds: str = data["system_creds"]
        self.nats_url = nats_url
        self.ttl_s = ttl_s
        self.tls_ca = tls_ca

    def __repr__(self) -> str:
        return f"InstanceIssuer(account={self.account!r})"

    def mint(self, spoke_id: str, now: float) -> str:
        """The creds text of spoke `spoke_id`'s instance, valid for `ttl_s` from `now`."""
        return self.issue(spoke_id, now).creds

    def issue(self, spoke_id: str, now: float) -> Issued:
        """`mint`, with the user's public key and expiry."""
        return mint(
            self._account_signer,
            self.account,
            f"spoke-{spoke_id}",
            spoke_permissions(spoke_id),
            int(now),
            self.ttl_s,
            user=self._user_key(spoke_id),
        )

    def user(self, spoke_id: str) -> str:
        """The public key the credentials of `spoke_id` are issued to."""
        return self._user_key(spoke_id).public

    async def revoke(self, spoke_ids: list[str], now: float) -> None:
        """Revoke every credential minted so far for these spoke ids (idempotent).

        Revocations older than `ttl_s` are dropped from the account on the way: every JWT they
        covered has expired. Raises IssuerError when the server cannot be reached or refuses.
        """
        if not spoke_ids:
            return
        await push_revocations(
            self.nats_url,
            system_creds=self._system_creds,
            operator_signer=self._operator_signer,
            account=self.account,
            revoke={self.user(spoke_id): int(now) for spoke_id in spoke_ids},
            now=int(now),
            forget_before=int(now) - self.ttl_s,
            tls_ca=self.tls_ca,
        )
        log.info("nats_credentials_revoked", spokes=sorted(spoke_ids))

    def _user_key(self, spoke_id: str) -> KeyPair:
        raw = hmac.new(
            self._account_signer.seed.encode(), f"burst-spoke:{spoke_id}".encode(), hashlib.sha256
        ).digest()
        return KeyPair(nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER).decode())


async def push_revocations(
    nats_url: str,
    *,
    system_creds: str,
    operator_signer: KeyPair,
    account: str,
    revoke: dict[str, int],
    now: int,
    forget_before: int | None = None,
    tls_ca: str | None = None,
) -> None:
    """Add `revoke` (user key -> time: its JWTs issued at or before it are refused) to the
    account JWT in force on the server's resolver, and push it back signed by the operator.

    The server closes the revoked users' connections at once and keeps the update across
    restarts; servers of its cluster learn it from each other. What others revoked stays, but
    revocations older than `forget_before` (their JWTs have all expired) are dropped. Raises
    IssuerError when the server cannot be reached or refuses.
    """
    subject = f"$SYS.REQ.ACCOUNT.{account}.CLAIMS"
    kwargs: dict[str, Any] = {"user_credentials": RawCredentials(system_creds)}
    if tls_ca:
        kwargs["tls"] = client_context(tls_ca)
    try:
        nc = await natsclient.connect(
            nats_url, name="gpufed-revoke", connect_timeout=2,
            max_reconnect_attempts=0, allow_reconnect=False, **kwargs,
        )  # fmt: skip
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        raise IssuerError(f"cannot reach NATS to revoke: {type(exc).__name__}") from exc
    try:
        current = (await nc.request(f"{subject}.LOOKUP", b"", timeout=5)).data.decode()
        claims = jwt.decode(current, {operator_signer.public})
        nats_claims = dict(claims["nats"])
        revocations = {
            user: int(at)
            for user, at in dict(nats_claims.get("revocations") or {}).items()
            if forget_before is None or int(at) >= forget_before
        }
        for user, at in revoke.items():
            revocations[user] = max(at, revocations.get(user, at))
        nats_claims["revocations"] = dict(sorted(revocations.items()))
        # The resolver keeps the newest JWT: issue strictly after the one in force.
        claims = {**claims, "nats": nats_claims, "iat": max(now, int(claims["iat"]) + 1)}
        token = jwt.encode(claims, operator_signer)
        reply = await nc.request(f"{subject}.UPDATE", token.encode(), timeout=5)
        answer = json.loads(reply.data or b"{}")
        if "error" in answer:
            raise IssuerError(f"resolver refused the account update: {answer['error']}")
    except (TimeoutError, nats.errors.Error, ValueError, KeyError) as exc:
        raise IssuerError(f"revocation failed: {type(exc).__name__}: {exc}") from exc
    finally:
        await nc.close()
