"""The embedded federation's NATS trust: operator, accounts, signing keys, creds files.

`NatsAuthority.open(dir)` creates (once) and then reuses, in a directory only its owner can
read (0700, files 0600):

- an operator with a signing key (the operator seed itself never signs anything else),
- the system account SYS (a `sys` user pushes account updates: revocations),
- the GPUFED account, which carries all gpufed traffic, with a signing key for users.

The server trusts the operator JWT and finds account JWTs through its `full` resolver, so it
checks every identity, permission and expiry itself, also while the hub is down. The issuer file
(`issuer_file`) is what the burst controller needs to mint and revoke per-instance credentials.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bus import jwt
from bus.jwt import KeyPair, Permissions

ACCOUNT_NAME = "GPUFED"
SYSTEM_ACCOUNT_NAME = "SYS"
#: A revocation's time that covers every JWT its user key was ever issued (9999-12-31): an
#: administrator's revocation of a credential that never expires. The burst issuer drops
#: revocations older than its own credentials' lifetime; this one it keeps.
REVOKED_FOR_GOOD = 253_402_300_799
_KEYS_FILE = "keys.json"
_ISSUER_FILE = "issuer.json"
#: The credentials issued with `keep=True` (deploy/: long-lived), by public key: their names.
_ISSUED_FILE = "issued.json"
#: The user keys an administrator revoked: their names and when.
_REVOKED_FILE = "revoked.json"


@dataclass(frozen=True, slots=True)
class Issued:
    """A minted user: its creds text (secret), public key and expiry (None: none)."""

    creds: str
    user: str
    expires_at: int | None

    def __repr__(self) -> str:
        return f"Issued(user={self.user!r}, expires_at={self.expires_at!r})"


class NatsAuthority:
    """Operator and accounts of one embedded federation, kept in `directory`."""

    def __init__(self, directory: Path, keys: dict[str, KeyPair], created_at: int) -> None:
        self.directory = directory
        self.operator = keys["operator"]
        self.operator_signer = keys["operator_signer"]
        self.system_account = keys["system_account"]
        self.account = keys["account"]
        self.account_signer = keys["account_signer"]
        self.created_at = created_at

    @classmethod
    def open(cls, directory: Path, now: int) -> NatsAuthority:
        """Load the keys kept in `directory`, creating them on first use."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        path = directory / _KEYS_FILE
        if path.exists():
            data = json.loads(path.read_text(encoding="utf-8"))
            keys = {name: KeyPair(seed) for name, seed in data["seeds"].items()}
            return cls(directory, keys, int(data["created_at"]))
        keys = {
            "operator": KeyPair.new("operator"),
            "operator_signer": KeyPair.new("operator"),
            "system_account": KeyPair.new("account"),
            "account": KeyPair.new("account"),
            "account_signer": KeyPair.new("account"),
        }
        seeds = {name: kp.seed for name, kp in keys.items()}
        write_secret(path, json.dumps({"created_at": now, "seeds": seeds}, indent=1))
        return cls(directory, keys, now)

    # --- what the server trusts (public) ---

    def operator_jwt(self) -> str:
        return jwt.operator_jwt(
            self.operator,
            "gpufed",
            system_account=self.system_account.public,
            signing_keys=[self.operator_signer.public],
            now=self.created_at,
        )

    def account_jwts(self, revoked: bool = False) -> dict[str, str]:
        """The accounts as first issued (a `full` resolver keeps newer ones: revocations pushed
        to it); with `revoked`, the GPUFED account carries `revoked()`'s keys, for a server
        whose accounts are only these (MEMORY)."""
        revoked_keys = self.revoked() if revoked else {}
        at = max([self.created_at, *(r["revoked_at"] for r in revoked_keys.values())])
        return {
            self.system_account.public: jwt.account_jwt(
                self.operator_signer,
                self.system_account.public,
                SYSTEM_ACCOUNT_NAME,
                now=self.created_at,
                jetstream=False,
            ),
            self.account.public: jwt.account_jwt(
                self.operator_signer,
                self.account.public,
                ACCOUNT_NAME,
                now=at,
                signing_keys=[self.account_signer.public],
                revocations=_for_good(revoked_keys),
            ),
        }

    def server_config(self, resolver_dir: Path) -> str:
        """The auth part of nats-server's config: operator mode with the `full` resolver."""
        operator_file = self.directory / "operator.jwt"
        operator_file.write_text(self.operator_jwt() + "\n", encoding="utf-8")
        return self.auth_config(json.dumps(str(operator_file)), str(resolver_dir))

    def auth_config(self, operator: str | None = None, resolver_dir: str | None = None) -> str:
        """Operator mode for a server config: `operator` is a quoted file path (default: the
        JWT itself, inline); with `resolver_dir` the `full` resolver keeps account updates
        (revocations) there, without it the accounts are the preloaded ones (MEMORY), with
        every key `revoke()`d so far refused."""
        accounts = self.account_jwts(revoked=resolver_dir is None)
        preload = "\n".join(f"  {pub}: {token}" for pub, token in accounts.items())
        if resolver_dir is None:
            resolver = "resolver: MEMORY\n"
        else:
            resolver = (
                "resolver: {\n"
                "  type: full\n"
                f"  dir: {json.dumps(resolver_dir)}\n"
                "  allow_delete: false\n"
                "}\n"
            )
        return (
            f"operator: {operator or self.operator_jwt()}\n"
            f"system_account: {self.system_account.public}\n"
            f"{resolver}"
            f"resolver_preload: {{\n{preload}\n}}\n"
        )

    # --- users ---

    def issue(
        self,
        name: str,
        permissions: Permissions,
        *,
        now: int,
        ttl_s: int | None = None,
        keep: bool = False,
    ) -> Issued:
        """A new GPUFED user with these permissions (and an expiry `ttl_s` from now); with
        `keep`, its key is noted under `name` so that `revoke` can find it later."""
        issued = mint(self.account_signer, self.account.public, name, permissions, now, ttl_s)
        if keep:
            kept = self.issued()
            kept[issued.user] = name
            write_secret(self.directory / _ISSUED_FILE, json.dumps(kept, indent=1))
        return issued

    def issued(self) -> dict[str, str]:
        """The user keys issued with `keep`, and the name each was issued to."""
        return _read_json(self.directory / _ISSUED_FILE)

    def revoked(self) -> dict[str, dict[str, Any]]:
        """The user keys revoked so far: {key: {"name": ..., "revoked_at": unix time}}."""
        return _read_json(self.directory / _REVOKED_FILE)

    def revocations(self) -> dict[str, int]:
        """`revoked()` as an account JWT's revocations: every key refused for good."""
        return _for_good(self.revoked())

    def revoke(self, users: dict[str, str], now: int) -> None:
        """Note these user keys (key -> name) revoked for good. Servers learn of it from the
        accounts this authority writes (MEMORY) or from a push (`bus.issuer.push_revocations`)."""
        revoked = self.revoked()
        for user, name in users.items():
            revoked.setdefault(user, {"name": name, "revoked_at": now})
        write_secret(self.directory / _REVOKED_FILE, json.dumps(revoked, indent=1))

    def issue_system(self, now: int) -> Issued:
        """A SYS-account user: may push account JWTs (revocations) to the resolver."""
        user = KeyPair.new("user")
        token = jwt.user_jwt(
            self.system_account, self.system_account.public, user.public, "sys",
            Permissions(pub_allow=("$SYS.REQ.ACCOUNT.>",), sub_allow=("_INBOX.>",)),
            now=now,
        )  # fmt: skip
        return Issued(jwt.creds(token, user), user.public, None)

    def issuer(self, now: int) -> str:
        """What the burst controller mints and revokes instance credentials with (JSON, holding
        signing seeds: a secret)."""
        data = {
            "account": self.account.public,
            "account_signer": self.account_signer.seed,
            "operator_signer": self.operator_signer.seed,
            "system_creds": self.issue_system(now).creds,
        }
        return json.dumps(data, indent=1)

    def write_issuer(self, path: Path, now: int) -> Path:
        """`issuer` in a file (0600): `gpufed burst --nats-issuer`."""
        write_secret(path, self.issuer(now))
        return path


def mint(
    signer: KeyPair,
    account: str,
    name: str,
    permissions: Permissions,
    now: int,
    ttl_s: int | None,
    user: KeyPair | None = None,
) -> Issued:
    """A user JWT for a fresh (or the given) user key, signed by an account signing key."""
    user = user or KeyPair.new("user")
    expires_at = None if ttl_s is None else now + ttl_s
    token = jwt.user_jwt(
        signer, account, user.public, name, permissions, now=now, expires_at=expires_at
    )
    return Issued(jwt.creds(token, user), user.public, expires_at)


def _for_good(keys: Iterable[str]) -> dict[str, int]:
    return dict.fromkeys(keys, REVOKED_FOR_GOOD)


def _read_json(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.exists() else {}


def write_secret(path: Path, text: str) -> Path:
    """Write `text` to `path` readable by its owner only (created 0600, never wider)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path
