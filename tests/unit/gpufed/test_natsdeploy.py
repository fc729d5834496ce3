"""`gpufed nats-authority init`: its arguments are checked before anything is written, and a
second run keeps the authority (credentials already deployed stay valid); `revoke` finds the
keys issued to a name and every later leaf config refuses them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bus import jwt
from bus.authority import REVOKED_FOR_GOOD
from gpufed.cli import main
from gpufed.natsdeploy import Region, revoke_deploy_auth, write_deploy_auth


@pytest.mark.parametrize("text", ["eu", "eu=", "EU=eu-1", "eu=bad id", "=eu-1"])
def test_a_malformed_region_is_refused_with_the_expected_shape(text: str) -> None:
    with pytest.raises(ValueError, match=r"REGION=SPOKE|not a spoke id"):
        Region.parse(text)


def test_regions_need_the_hubs_leaf_address(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--hub-leaf-url"):
        write_deploy_auth(tmp_path / "out", now=1, regions=[Region.parse("eu=eu-1")])
    assert not (tmp_path / "out").exists()


def test_running_again_keeps_the_authority(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["nats-authority", "init", "--out", str(out), "--hub-spoke", "cloud-1"]
    assert main(args) == 0
    keys = (out / "authority" / "keys.json").read_text()
    assert main([*args, "--region", "eu=eu-1", "--hub-leaf-url", "tls://hub:7422"]) == 0

    assert (out / "authority" / "keys.json").read_text() == keys
    printed = capsys.readouterr().out.split()
    assert str(out / "regions" / "eu" / "spoke-eu-1.yaml") in printed
    assert main([*args, "--region", "eu"]) == 1


def test_revoke_finds_what_an_older_init_issued_and_the_leaf_refuses_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    regions = [Region.parse("eu=eu-1,eu-2")]
    write_deploy_auth(out, now=100, regions=regions, hub_leaf_url="tls://hub:7422")
    (out / "authority" / "issued.json").unlink()  # as an init from before the list was kept
    leaked = _user_of(secret(out / "regions" / "eu" / "spoke-eu-1.yaml")["creds"])

    revoked = revoke_deploy_auth(out, ["eu-1"], now=200)

    assert revoked.users == {leaked: "spoke-eu-1"}
    assert revoked.written == [out / "regions" / "eu" / "nats-auth.yaml"]
    accounts = _leaf_accounts(out)
    assert accounts[leaked] == REVOKED_FOR_GOOD
    # Kept: init run again (fresh keys for every component) still writes the leaf with it.
    write_deploy_auth(out, now=300, regions=regions, hub_leaf_url="tls://hub:7422")
    assert _leaf_accounts(out) == accounts
    fresh = _user_of(secret(out / "regions" / "eu" / "spoke-eu-1.yaml")["creds"])
    assert fresh != leaked and fresh not in accounts
    assert (
        'GPUFED_HUB_LEAF_URL: "tls://hub:7422"'
        in secret(out / "regions/eu/nats-auth.yaml")["auth.conf"]
    )


def secret(path: Path) -> dict[str, str]:
    return dict(yaml.safe_load(path.read_text())["stringData"])


def _user_of(creds: str) -> str:
    return str(jwt.decode(jwt.creds_jwt(creds))["sub"])


def _leaf_accounts(out: Path) -> dict[str, int]:
    """The revocations of the GPUFED account the eu leaf preloads."""
    auth = secret(out / "regions" / "eu" / "nats-auth.yaml")["auth.conf"]
    tokens = re.findall(r"^  A\w+: (\S+)$", auth, re.MULTILINE)
    accounts = [jwt.decode(t) for t in tokens]
    (gpufed,) = [a for a in accounts if a["name"] == "GPUFED"]
    return dict(gpufed["nats"].get("revocations", {}))
