"""NATS decentralized auth: nkeys, operator / account / user JWTs and `.creds` files.

The format is nats-io/jwt v2: `b64url(header).b64url(claims).b64url(ed25519 signature)`,
unpadded, header `{"typ":"JWT","alg":"ed25519-nkey"}`. The server checks every signature, the
chain operator → account → user, a user's permissions and its `exp`, and an account's
`revocations`; this module only writes (and, before trusting one, verifies) such JWTs.
Times are passed in (seconds since the epoch): nothing here reads the clock.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any

import nacl.signing  # nkeys' own dependency: its KeyPair cannot verify without a seed
import nkeys

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_PREFIXES = {
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
}
#: Limits of an account that carries gpufed's traffic: unlimited, JetStream on.
_OPEN_LIMITS = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
}
_JETSTREAM_LIMITS = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


class JwtError(ValueError):
    """A JWT or creds text that is malformed or not signed as it claims."""


@dataclass(frozen=True, slots=True)
class Permissions:
    """What a NATS user may publish and subscribe to.

    `responses`: the user may publish one reply to each request it received, within
    `response_ttl_s` (NATS `allow_responses`), without a publish right on reply subjects.
    """

    pub_allow: tuple[str, ...] = ()
    pub_deny: tuple[str, ...] = ()
    sub_allow: tuple[str, ...] = ()
    sub_deny: tuple[str, ...] = ()
    responses: bool = False
    response_ttl_s: float = 60.0

    def claims(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "pub": _allow_deny(self.pub_allow, self.pub_deny),
            "sub": _allow_deny(self.sub_allow, self.sub_deny),
        }
        if self.responses:
            # `max`/`ttl` (nanoseconds) are the server's names; other spellings are ignored.
            out["resp"] = {"max": 1, "ttl": int(self.response_ttl_s * 1e9)}
        return out


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An nkey: its seed (the secret) and public key, both as text."""

    seed: str
    public: str = field(init=False)

    def __post_init__(self) -> None:
        try:
            kp = nkeys.from_seed(self.seed.encode())
        except Exception as exc:  # nkeys raises its own bare errors
            raise JwtError("not an nkey seed") from exc
        object.__setattr__(self, "public", kp.public_key.decode())

    @classmethod
    def new(cls, kind: str) -> KeyPair:
        """A fresh key of `kind` (operator, account or user) from the OS's random source."""
        return cls(nkeys.encode_seed(os.urandom(32), _PREFIXES[kind]).decode())

    def sign(self, data: bytes) -> bytes:
        return bytes(nkeys.from_seed(self.seed.encode()).sign(data))

    def __repr__(self) -> str:  # the seed never reaches a log or a traceback
        return f"KeyPair(public={self.public!r})"


def encode(claims: dict[str, Any], signer: KeyPair) -> str:
    """Sign `claims` (with `iss` set to the signer and a content-derived `jti`)."""
    body = {k: v for k, v in claims.items() if k != "jti"}
    body["iss"] = signer.public
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    head = _b64(json.dumps(_HEADER, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = signer.sign(f"{head}.{payload}".encode())
    return f"{head}.{payload}.{_b64(signature)}"


def decode(token: str, trusted_issuers: set[str] | None = None) -> dict[str, Any]:
    """The claims of `token`, after checking its signature against its own `iss`.

    With `trusted_issuers`, `iss` must also be one of them. Raises JwtError otherwise.
    """
    try:
        head, payload, signature = token.strip().split(".")
        claims = json.loads(_unb64(payload))
        issuer = str(claims["iss"])
        _verify_key(issuer).verify(f"{head}.{payload}".encode(), _unb64(signature))
    except JwtError:
        raise
    except Exception as exc:
        raise JwtError("not a validly signed NATS JWT") from exc
    if trusted_issuers is not None and issuer not in trusted_issuers:
        raise JwtError(f"JWT signed by an untrusted key {issuer}")
    return dict(claims)


def operator_jwt(
    operator: KeyPair, name: str, *, system_account: str, signing_keys: list[str], now: int
) -> str:
    """The self-signed operator JWT the server trusts (`operator:` in its config)."""
    claims = {
        "iat": now,
        "name": name,
        "sub": operator.public,
        "nats": {
            "system_account": system_account,
            "signing_keys": signing_keys,
            "type": "operator",
            "version": 2,
        },
    }
    return encode(claims, operator)


def account_jwt(
    signer: KeyPair,
    account: str,
    name: str,
    *,
    now: int,
    signing_keys: list[str] | None = None,
    revocations: dict[str, int] | None = None,
    jetstream: bool = True,
) -> str:
    """An account JWT signed by the operator (or one of its signing keys).

    `revocations` maps a user's public key to a time: that user's JWTs issued at or before it
    are refused, and its connections are closed when the server gets this JWT.
    """
    limits: dict[str, Any] = dict(_OPEN_LIMITS)
    limits.update(_JETSTREAM_LIMITS if jetstream else {"mem_storage": 0, "disk_storage": 0})
    nats: dict[str, Any] = {
        "limits": limits,
        "default_permissions": {"pub": {}, "sub": {}},
        "type": "account",
        "version": 2,
    }
    if signing_keys:
        nats["signing_keys"] = signing_keys
    if revocations:
        nats["revocations"] = dict(sorted(revocations.items()))
    return encode({"iat": now, "name": name, "sub": account, "nats": nats}, signer)


def user_jwt(
    signer: KeyPair,
    account: str,
    user: str,
    name: str,
    permissions: Permissions,
    *,
    now: int,
    expires_at: int | None = None,
) -> str:
    """A user JWT signed by `account` or one of its signing keys, expiring at `expires_at`."""
    nats: dict[str, Any] = {
        **permissions.claims(),
        "subs": -1,
        "data": -1,
        "payload": -1,
        "type": "user",
        "version": 2,
    }
    if signer.public != account:
        nats["issuer_account"] = account
    claims: dict[str, Any] = {"iat": now, "name": name, "sub": user, "nats": nats}
    if expires_at is not None:
        claims["exp"] = expires_at
    return encode(claims, signer)


def creds(jwt: str, user: KeyPair) -> str:
    """The `.creds` text nats clients read: the user JWT and the user's seed."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user.seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


def creds_jwt(text: str) -> str:
    """The user JWT inside a `.creds` text (raises JwtError if there is none)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("-----BEGIN NATS USER JWT") and i + 1 < len(lines):
            return lines[i + 1].strip()
    raise JwtError("no user JWT in the creds text")


def creds_seed(text: str) -> str:
    """The user seed inside a `.creds` text (raises JwtError if there is none)."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("-----BEGIN USER NKEY SEED") and i + 1 < len(lines):
            return lines[i + 1].strip()
    raise JwtError("no user seed in the creds text")


def _allow_deny(allow: tuple[str, ...], deny: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if allow:
        out["allow"] = list(allow)
    if deny:
        out["deny"] = list(deny)
    return out


def _verify_key(public: str) -> nacl.signing.VerifyKey:
    raw = base64.b32decode(public.encode())
    if len(raw) != 35:
        raise JwtError("not an nkey public key")
    return nacl.signing.VerifyKey(raw[1:33])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
