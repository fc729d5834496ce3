"""`gpufed nats-authority revoke`: a leaked component credential is refused by the shipped
leaf and hub configs, a fresh one for the same component is not, and the burst controller's
own revocations on the same account leave the administrator's in force."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import nats.errors
import pytest

from bus import identities
from bus.issuer import InstanceIssuer
from bus.natsclient import Client
from gpufed.natsdeploy import Region, write_deploy_auth
from tests.kubernetes.deploysupport import (
    DEPLOY,
    running_server,
    secret_data,
    server_files,
    server_process,
    tls_dir_for_tests,
)
from tests.kubernetes.test_deploy_nats import CUT_SHORT, assert_refused, connect_tls

pytestmark = pytest.mark.security


def init(out: Path) -> None:
    """`gpufed nats-authority init` for one region (eu: eu-1, eu-2) and a hub spoke."""
    write_deploy_auth(
        out,
        now=int(time.time()),
        regions=(Region("eu", ("eu-1", "eu-2")),),
        hub_spokes=("cloud-1",),
        hub_leaf_url="tls://127.0.0.1:9",
        burst=True,
    )


def revoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufed", "nats-authority", "revoke", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def spoke(url: str, creds: str, spoke_id: str) -> Client:
    client = await connect_tls(url, creds, inbox_prefix=identities.inbox_prefix(spoke_id))
    await client.flush()
    assert client.is_connected
    return client


async def until_closed(client: Client) -> None:
    with anyio.fail_after(5):
        while not client.is_closed:
            await anyio.sleep(0.02)


async def test_a_revoked_spoke_is_refused_by_its_leaf_once_reloaded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    init(out)
    root = tmp_path / "leaf"
    config = server_files((DEPLOY / "nats" / "leaf-eu.conf").read_text(), None, root)

    def apply_auth_secret() -> None:  # the Secret gpufed-nats-auth, as the pod mounts it
        for name, value in secret_data("regions/eu/nats-auth.yaml", out).items():
            (root / "auth" / name).write_text(value)

    apply_auth_secret()
    with server_process(config) as (url, leaf):
        leaked = secret_data("regions/eu/spoke-eu-1.yaml", out)["creds"]
        victim = await spoke(url, leaked, "eu-1")
        other = secret_data("regions/eu/spoke-eu-2.yaml", out)["creds"]
        neighbour = await spoke(url, other, "eu-2")

        done = revoke("--out", str(out), "eu-1")  # a bare spoke id means its spoke

        assert done.returncode == 0, done.stderr
        assert "revoked spoke-eu-1: 1 credential(s)" in done.stdout
        assert "regions/eu/nats-auth.yaml" in done.stdout and "reload" in done.stdout
        assert "not pushed to the hub's NATS" in done.stderr
        assert victim.is_connected  # the leaf knows nothing until its Secret is reloaded
        apply_auth_secret()
        leaf.send_signal(signal.SIGHUP)  # `nats-server --signal reload`, as deploy/README says
        await until_closed(victim)
        await assert_refused(url, leaked, inbox_prefix=identities.inbox_prefix("eu-1"))
        await neighbour.flush()
        assert neighbour.is_connected

        # `init` again issues eu-1 a fresh credential: the leaked key stays refused, the new
        # one is let in.
        init(out)
        apply_auth_secret()
        leaf.send_signal(signal.SIGHUP)
        fresh = secret_data("regions/eu/spoke-eu-1.yaml", out)["creds"]
        with anyio.fail_after(5):
            while True:
                try:
                    renewed = await spoke(url, fresh, "eu-1")
                    break
                except (nats.errors.Error, *CUT_SHORT):  # the reload is not in force yet
                    await anyio.sleep(0.05)
        await assert_refused(url, leaked, inbox_prefix=identities.inbox_prefix("eu-1"))
        for client in (neighbour, renewed):
            await client.close()


async def test_a_revoked_hub_spoke_is_cut_off_at_once_and_burst_keeps_it_refused(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    init(out)
    config = server_files(
        (DEPLOY / "nats" / "hub.conf").read_text(), "hub/nats-auth.yaml", tmp_path / "hub", out
    )
    ca = str(tls_dir_for_tests() / "ca.crt")
    with running_server(config) as url:
        leaked = secret_data("hub/spoke-cloud-1.yaml", out)["creds"]
        victim = await spoke(url, leaked, "cloud-1")

        done = revoke("--out", str(out), "--nats-url", url, "--nats-ca", ca, "spoke-cloud-1")

        assert done.returncode == 0, done.stderr
        assert "pushed to the hub's NATS" in done.stdout
        await until_closed(victim)
        await assert_refused(url, leaked, inbox_prefix=identities.inbox_prefix("cloud-1"))

        # The burst controller revokes an instance a while later and drops the revocations
        # older than its credentials' lifetime on the way: the administrator's is not one.
        issuer_file = tmp_path / "issuer"
        issuer_file.write_text(secret_data("hub/burst-nats.yaml", out)["issuer"])
        issuer = InstanceIssuer(issuer_file, url, ttl_s=60, tls_ca=ca)
        await issuer.revoke(["burst-9"], time.time() + 120)
        await assert_refused(url, leaked, inbox_prefix=identities.inbox_prefix("cloud-1"))


def test_revoke_names_what_it_cannot_find(tmp_path: Path) -> None:
    out = tmp_path / "out"
    missing = revoke("--out", str(out), "eu-1")
    assert missing.returncode == 2
    assert "no authority here" in missing.stderr
    init(out)
    unknown = revoke("--out", str(out), "eu-9")
    assert unknown.returncode == 2
    assert "nothing was issued to 'eu-9'" in unknown.stderr
    assert "spoke-eu-1" in unknown.stderr and "leaf-eu" in unknown.stderr
    assert "BEGIN" not in unknown.stderr + unknown.stdout  # no credential text, ever
