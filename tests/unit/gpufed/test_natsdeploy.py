"""`gpufed nats-authority init`: its arguments are checked before anything is written, and a
second run keeps the authority (credentials already deployed stay valid)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed.cli import main
from gpufed.natsdeploy import Region, write_deploy_auth


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
