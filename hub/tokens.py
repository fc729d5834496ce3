"""gpufed API tokens: minted here, stored as a SHA-256 of their secret, checked in constant time.

A token reads `gpufed_<id>_<secret>`: the id finds the stored row, the secret (32 random bytes)
is compared by its hash with `hmac.compare_digest`. The secret is shown once, when minted; the
store never holds it, so a leaked database does not leak usable tokens.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from hub.authstore import AuthStore, TokenRecord
from hub.core.access import Principal, Role
from hub.errors import InvalidRequest, Unauthenticated
from schemas.common import DNS_LABEL_PATTERN

PREFIX = "gpufed_"
#: How long a team or user name may be in a token (a DNS label's length).
MAX_NAME = 63


class InvalidToken(Unauthenticated):
    """The token is not one of ours, unknown, revoked or expired (the API answers 401)."""


def mint_token(
    store: AuthStore,
    *,
    user: str,
    role: Role,
    team: str | None,
    created_by: str,
    now: float,
    ttl_s: float | None = None,
) -> tuple[str, TokenRecord]:
    """Create and store a token; returns the secret token text (shown once) and its record.

    `admin` takes no team; every other role needs one. Raises InvalidRequest naming the field.
    """
    check_grant(user, role, team)
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    record = TokenRecord(
        id=token_id,
        user=user,
        team=team,
        role=role.value,
        secret_hash=_hash(secret),
        created_at=now,
        created_by=created_by,
        expires_at=None if ttl_s is None else now + ttl_s,
    )
    store.add_token(record)
    return f"{PREFIX}{token_id}_{secret}", record


def check_grant(user: str, role: Role, team: str | None) -> None:
    """Raise InvalidRequest when a user/role/team combination cannot be a token."""
    if not user or len(user) > MAX_NAME or not user.isprintable():
        raise InvalidRequest(f"user: 1 to {MAX_NAME} printable characters", field="user")
    if role is Role.ADMIN:
        if team is not None:
            raise InvalidRequest("an admin token is for every team: give no team", field="team")
        return
    if team is None:
        raise InvalidRequest(f"a {role.value} token needs a team", field="team")
    if not re.match(DNS_LABEL_PATTERN, team):
        raise InvalidRequest(f"team: {team!r} is not a team name", field="team")


def token_id_of(text: str) -> str | None:
    """The id part of a gpufed token, or None when `text` is not shaped like one."""
    if not text.startswith(PREFIX):
        return None
    token_id, sep, secret = text[len(PREFIX) :].partition("_")
    if not sep or not token_id or not secret or len(text) > 200:
        return None
    return token_id


def verify_token(record: TokenRecord | None, text: str, now: float) -> Principal:
    """The principal a presented token stands for; raises InvalidToken otherwise.

    The comparison is constant-time on the SHA-256 of the secret; an unknown id is compared
    against a dummy hash so it costs the same.
    """
    secret = text.partition("_")[2].partition("_")[2]
    expected = record.secret_hash if record is not None else _DUMMY_HASH
    matches = hmac.compare_digest(expected.encode(), _hash(secret).encode())
    if record is None or not matches:
        raise InvalidToken("unknown or malformed token")
    if record.revoked_at is not None:
        raise InvalidToken(f"token {record.id} was revoked")
    if record.expires_at is not None and now >= record.expires_at:
        raise InvalidToken(f"token {record.id} expired")
    role = Role(record.role)
    if role is Role.ADMIN:
        return Principal(user=record.user, admin=True, via=f"token:{record.id}")
    teams = {record.team: role} if record.team else {}
    return Principal(user=record.user, teams=teams, via=f"token:{record.id}")


def write_token_file(path: Path, token: str) -> None:
    """Write `token` to `path` readable by its owner only (0600 from the first byte)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


_DUMMY_HASH = _hash("no such token")


def ensure_admin_token(store: AuthStore, path: Path, now: float) -> str:
    """The admin token in `path` if the store still accepts it, else a new one written there.

    What `gpufed up` does on every start: the first start mints the admin token; later ones
    keep it, unless it was revoked or the store was replaced.
    """
    if path.exists():
        text = path.read_text().strip()
        token_id = token_id_of(text)
        if token_id is not None:
            try:
                if verify_token(store.token(token_id), text, now).admin:
                    return text
            except InvalidToken:
                pass
    token, _ = mint_token(
        store, user="admin", role=Role.ADMIN, team=None, created_by="gpufed up", now=now
    )
    write_token_file(path, token)
    return token
