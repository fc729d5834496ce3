"""OIDC bearer tokens: signed by the configured issuer's key, groups mapped to team roles."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import rsa

from gpufed.cli import main
from hub.oidc import InvalidOidcConfig, OidcSettings
from tests.integration.fed import InProcessFederation

ISSUER = "https://login.example.test/realms/ml"


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _setup(root: Path, key: rsa.RSAPrivateKey) -> Path:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    (root / "jwks.json").write_text(json.dumps({"keys": [{**jwk, "kid": "k1", "use": "sig"}]}))
    config = {
        "issuer": ISSUER,
        "audience": "gpufed",
        "jwks_file": "jwks.json",
        "user_claim": "email",
        "admin_groups": ["platform"],
        "group_roles": {"ml-vision": {"team": "vision", "role": "member"}},
        "groups_are_teams": True,
    }
    path = root / "oidc.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _token(key: rsa.RSAPrivateKey, **claims: Any) -> str:
    now = int(time.time())
    body = {
        "iss": ISSUER,
        "aud": "gpufed",
        "sub": "u1",
        "email": "ana@example.test",
        "groups": ["ml-vision"],
        "iat": now,
        "exp": now + 300,
        **claims,
    }
    return jwt.encode(body, key, algorithm="RS256", headers={"kid": "k1"})


async def test_oidc_tokens_map_groups_to_team_roles_and_forgeries_are_refused(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    key = _key()
    await fed.start_hub(oidc_config=_setup(tmp_path, key))
    job = {"name": "j", "command": ["sleep", "60"]}

    async with fed.client(_token(key)) as ana:
        me = (await ana.get("/v1/whoami")).json()
        assert me["user"] == "ana@example.test" and me["teams"] == {"vision": "member"}
        assert (await ana.post("/v1/workloads", json={**job, "team": "vision"})).status_code == 201
        assert (await ana.post("/v1/workloads", json={**job, "team": "nlp"})).status_code == 403
    async with fed.client(_token(key, groups=["nlp"])) as team_named:
        assert (await team_named.get("/v1/whoami")).json()["teams"] == {"nlp": "member"}
    async with fed.client(_token(key, groups=["platform"])) as admin:
        assert (await admin.get("/v1/tokens")).status_code == 200

    refused = [
        _token(_key()),  # signed by another key
        _token(key, exp=int(time.time()) - 3600),  # expired
        _token(key, iss="https://evil.example.test"),  # another issuer
        _token(key, aud="someone-else"),  # for another service
        jwt.encode({"iss": ISSUER, "aud": "gpufed", "exp": 2**40}, "s" * 32, algorithm="HS256"),
        _token(key).rsplit(".", 1)[0] + ".",  # signature stripped
    ]
    for token in refused:
        async with fed.client(token) as caller:
            response = await caller.get("/v1/whoami")
            assert response.status_code == 401, response.text


@pytest.mark.parametrize(
    ("config", "jwks", "problem"),
    [
        ({"issuer": ISSUER, "audience": "gpufed"}, None, "give exactly one of jwks_file"),
        (
            {"issuer": ISSUER, "audience": "gpufed", "jwks_file": "jwks.json"},
            {"keys": []},
            "jwks.json: The JWK Set did not contain any keys",
        ),
    ],
)
def test_a_bad_oidc_config_stops_the_hub_with_one_line_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any],
    jwks: dict[str, Any] | None,
    problem: str,
) -> None:
    path = tmp_path / "oidc.yaml"
    path.write_text(yaml.safe_dump(config))
    if jwks is not None:
        (tmp_path / "jwks.json").write_text(json.dumps(jwks))
    # Refused while the hub is built, before it connects anywhere: no NATS is needed.
    argv = ["hub", "--oidc-config", str(path), "--data-dir", str(tmp_path / "hub")]
    code = main([*argv, "--nats-url", "nats://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert code == 1
    # The store's own log lines may come first; the refusal is one line, not a traceback.
    last = err.strip().splitlines()[-1]
    assert last.startswith("gpufed hub: --oidc-config ") or last.startswith("gpufed hub: jwks")
    assert problem in last and "Traceback" not in err


def test_an_oidc_config_without_an_audience_is_refused(tmp_path: Path) -> None:
    # Without one, a token the issuer made for any other application (same realm, same
    # groups) would be taken by the hub: the config must say which `aud` is gpufed's.
    config = _setup(tmp_path, _key())
    data = yaml.safe_load(config.read_text())
    del data["audience"]
    config.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidOidcConfig, match="give the audience"):
        OidcSettings.load(config)
