"""NATS JWTs we sign: the chain verifies, a tampered or foreign one does not; URLs are masked."""

from __future__ import annotations

import pytest

from bus import jwt
from bus.client import mask_url
from bus.jwt import JwtError, KeyPair, Permissions

pytestmark = pytest.mark.security


def test_a_user_jwt_verifies_and_carries_its_permissions_and_expiry() -> None:
    account, signer, user = KeyPair.new("account"), KeyPair.new("account"), KeyPair.new("user")
    permissions = Permissions(pub_allow=("a.>",), sub_allow=("_INBOX_x.>",), responses=True)
    token = jwt.user_jwt(
        signer, account.public, user.public, "spoke-x", permissions, now=100, expires_at=160
    )
    claims = jwt.decode(token, {signer.public})
    assert (claims["sub"], claims["iss"], claims["exp"]) == (user.public, signer.public, 160)
    nats = claims["nats"]
    assert nats["issuer_account"] == account.public
    assert nats["pub"] == {"allow": ["a.>"]} and nats["sub"] == {"allow": ["_INBOX_x.>"]}
    assert nats["resp"] == {"max": 1, "ttl": 60_000_000_000}  # the server's names and units
    assert jwt.creds_jwt(jwt.creds(token, user)) == token


def test_a_tampered_or_foreign_jwt_is_refused() -> None:
    signer, other = KeyPair.new("account"), KeyPair.new("account")
    token = jwt.account_jwt(signer, other.public, "GPUFED", now=1, revocations={"U1": 5})
    head, _, signature = token.split(".")
    forged = jwt.encode({"sub": other.public, "nats": {"revocations": {}}}, other)
    with pytest.raises(JwtError):
        jwt.decode(f"{head}.{forged.split('.')[1]}.{signature}")
    with pytest.raises(JwtError, match="untrusted"):
        jwt.decode(forged, {signer.public})
    assert jwt.decode(token, {signer.public})["nats"]["revocations"] == {"U1": 5}


def test_seeds_stay_out_of_reprs() -> None:
    key = KeyPair.new("user")
    assert key.seed not in repr(key)


@pytest.mark.parametrize(
    ("logged", "masked"),
    [
        ("nats://hub:s3cret@nats:4222", "nats://hub:***@nats:4222"),
        ("tls://t0ken@nats:4222", "tls://***@nats:4222"),
        ("nats://a:1@h:1,nats://b:2@h:2", "nats://a:***@h:1,nats://b:***@h:2"),
        ("to nats-leaf://leaf-eu:pw@hub:7422 failed", "to nats-leaf://leaf-eu:***@hub:7422 failed"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ],
)  # fmt: skip
def test_passwords_in_urls_are_masked(logged: str, masked: str) -> None:
    assert mask_url(logged) == masked
