"""deploy/slurm against the shipped leaf config: a Slurm login node's spoke, set up as
deploy/slurm/README.md says (its unit, its settings file, the credential `gpufed
nats-authority init` writes for it), joins its region's leaf node as itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import anyio
import nats
import pytest

from bus.tls import client_context
from gpufed.cli import _parser, main
from gpufed.cliflags import nats_url
from gpufed.compose.spoke import build_spoke
from spoke.inventory.static import StaticInventory
from spoke.settings import SpokeSettings
from tests.kubernetes.deploysupport import DEPLOY, running_server, server_files, tls_dir_for_tests
from tests.unit.gpufed.test_deploy_slurm import exec_start, settings_file

SPOKE = "hpc-eu-h100"
#: Long enough for any accepted connect on a loaded machine; a refused one never ends.
REFUSED_AFTER_S = 30


async def test_the_slurm_spoke_reaches_its_leaf_with_its_own_credential(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "gpufed-nats"
    init = ["nats-authority", "init", "--out", str(out), "--region", f"eu=eu-west-1,{SPOKE}"]
    assert main([*init, "--hub-leaf-url", "tls://127.0.0.1:9"]) == 0
    # What README.md installs under /etc/gpufed, here under tmp_path/etc.
    etc = tmp_path / "etc"
    etc.mkdir()
    shutil.copy(out / "regions" / "eu" / f"spoke-{SPOKE}.creds", etc)
    shutil.copy(tls_dir_for_tests() / "ca.crt", etc / "nats-ca.crt")
    leaf_conf = (DEPLOY / "nats" / "leaf-eu.conf").read_text()
    leaf = server_files(leaf_conf, "regions/eu/nats-auth.yaml", tmp_path / "leaf", out=out)

    with running_server(leaf) as leaf_url:
        # The settings file as systemd's EnvironmentFile= gives it, pointed at this leaf.
        for key, value in settings_file().items():
            value = value.replace("/etc/gpufed", str(etc))
            value = value.replace("nats-leaf.eu.example.org:4222", leaf_url.split("//")[1])
            monkeypatch.setenv(key, value)
        args = _parser().parse_args(exec_start()[1:])
        settings = SpokeSettings(
            id=args.id,
            region=args.region,
            nats_url=nats_url(args),
            nats_creds=args.nats_creds,
            nats_ca=args.nats_ca,
            inventory=args.inventory,
            runtime=args.runtime,
            state_dir=tmp_path / "state",
            slurm_partition=args.slurm_partition,
        )
        assert "@" not in settings.nats_url  # no password in the URL
        agent = build_spoke(settings, inventory=StaticInventory([]))
        region_admin = await nats.connect(
            leaf_url,
            tls=client_context(etc / "nats-ca.crt"),
            user_credentials=str(out / "regions" / "eu" / "admin.creds"),
            allow_reconnect=False,
        )
        try:
            seen = await region_admin.subscribe(f"gpufed.v1.spoke.{SPOKE}.capacity")
            await region_admin.flush()
            # A refused spoke retries for ever (as under systemd); the test gives up instead.
            with anyio.fail_after(REFUSED_AFTER_S):
                await agent.bus.connect()
            await agent.bus.publish(f"gpufed.v1.spoke.{SPOKE}.capacity", b"from the login node")
            await agent.bus.nc.flush()
            report = await seen.next_msg(timeout=5)
        finally:
            await agent.bus.close()
            await region_admin.close()

    assert report.data == b"from the login node"
