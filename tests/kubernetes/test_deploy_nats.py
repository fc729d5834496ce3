"""deploy/nats: the shipped configs run in operator mode with the trust `gpufed nats-authority
init` generates, and every credential it writes is confined to its component's subjects."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import nats
import nats.errors
import pytest
from nats.aio.client import RawCredentials

from bus import identities, natsclient
from bus.authority import NatsAuthority
from bus.issuer import InstanceIssuer
from bus.natsclient import Client
from bus.tls import client_context
from tests.kubernetes.deploysupport import (
    DEPLOY,
    generated_auth,
    nats_check,
    one,
    render,
    running_server,
    secret_data,
    server_files,
    tls_dir_for_tests,
)

pytestmark = pytest.mark.security


@pytest.mark.parametrize(
    ("overlay", "domain", "replicas", "auth"),
    [
        ("embedded-hub", "hub", 3, "hub/nats-auth.yaml"),
        ("hub-postgres", "hub", 3, "hub/nats-auth.yaml"),
        ("spoke-eu", "eu", 1, "regions/eu/nats-auth.yaml"),
        ("spoke-us", "us", 1, "regions/us/nats-auth.yaml"),
    ],
)
def test_nats_server_mounts_its_own_valid_config(
    overlay: str, domain: str, replicas: int, auth: str, tmp_path: Path
) -> None:
    docs = render(overlay)
    nats_set = one(docs, "StatefulSet", "gpufed-nats")
    assert nats_set["spec"]["replicas"] == replicas
    pod = nats_set["spec"]["template"]["spec"]
    mounted = pod["volumes"][0]["configMap"]["name"]
    configs = [d for d in docs if d["kind"] == "ConfigMap" and "nats.conf" in d.get("data", {})]
    assert [c["metadata"]["name"] for c in configs] == [mounted], "only its own config ships"
    # The operator and accounts come from the mounted auth Secret; no password in the env.
    mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets[mounts["/etc/nats/auth"]] == "gpufed-nats-auth"
    assert "envFrom" not in pod["containers"][0]
    text = configs[0]["data"]["nats.conf"]

    checked = nats_check(server_files(text, auth, tmp_path))

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"domain: {domain}" in text
    assert "password:" not in text and "$GPUFED_NATS_" not in text


@pytest.mark.parametrize("name", ["hub.conf", "leaf-eu.conf", "leaf-us.conf"])
def test_nats_configs_refuse_to_start_without_their_auth(name: str, tmp_path: Path) -> None:
    refused = nats_check(server_files((DEPLOY / "nats" / name).read_text(), None, tmp_path))

    assert refused.returncode != 0
    assert "auth.conf" in refused.stdout + refused.stderr


def test_generated_secrets_are_private_and_name_what_the_pods_mount() -> None:
    out = generated_auth()
    assert out.stat().st_mode & 0o077 == 0
    for path in out.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o077 == 0, path
    assert set(secret_data("hub/hub-nats.yaml")) == {"url", "creds"}
    assert set(secret_data("hub/burst-nats.yaml")) == {"url", "creds", "issuer"}
    assert set(secret_data("regions/eu/spoke-eu-west-1.yaml")) == {"url", "creds"}
    assert set(secret_data("regions/eu/nats-auth.yaml")) == {"auth.conf", "leaf.creds"}
    assert "resolver: {" in secret_data("hub/nats-auth.yaml")["auth.conf"]  # full: revocations


@pytest.fixture
def hub_nats(tmp_path: Path) -> Iterator[str]:
    """The hub cluster's real config with its generated auth, one server on loopback (its
    cluster routes to the other pods just keep retrying)."""
    shipped = (DEPLOY / "nats" / "hub.conf").read_text()
    with running_server(server_files(shipped, "hub/nats-auth.yaml", tmp_path)) as url:
        yield url


@pytest.fixture
def leaf_eu(tmp_path: Path) -> Iterator[str]:
    """The eu leaf node's real config with its generated auth, on loopback (its hub link just
    keeps retrying)."""
    shipped = (DEPLOY / "nats" / "leaf-eu.conf").read_text()
    with running_server(server_files(shipped, "regions/eu/nats-auth.yaml", tmp_path)) as url:
        yield url


async def connect_tls(url: str, creds: str | None = None, **options: Any) -> Client:
    """Connect over TLS (checked against the test CA) with a generated credential's text."""
    return await natsclient.connect(
        url,
        tls=client_context(tls_dir_for_tests() / "ca.crt"),
        user_credentials=RawCredentials(creds) if creds else None,
        allow_reconnect=False,
        connect_timeout=3,
        **options,
    )


#: Tries at seeing the server's reason for refusing a credential (every one must be refused).
REFUSAL_TRIES = 20
#: How a refused client can fail before it has read the server's -ERR: the server closed the
#: connection while the client was still writing its CONNECT (TLS reports the reset first).
CUT_SHORT = (ConnectionResetError, BrokenPipeError, nats.errors.UnexpectedEOF)


async def assert_refused(url: str, creds: str, **options: Any) -> None:
    """The server refuses `creds`: no try connects, and one shows its reason (an
    Authorization Violation). A try cut short before the reason arrived is refused too, but
    says nothing of why: it is made again, up to REFUSAL_TRIES times."""
    for _ in range(REFUSAL_TRIES):
        try:
            client = await connect_tls(url, creds, **options)
        except CUT_SHORT:
            continue
        except nats.errors.Error as exc:
            assert "Authorization Violation" in str(exc)
            return
        await client.close()
        raise AssertionError("a credential the server should refuse was let in")
    raise AssertionError(f"refused {REFUSAL_TRIES} times, never with the server's reason")


def creds_of(secret: str) -> str:
    return secret_data(secret)["creds"]


def admin_creds(region: str) -> str:
    return (generated_auth() / "regions" / region / "admin.creds").read_text()


async def wait_for_errors(errors: list[str], count: int) -> None:
    with anyio.fail_after(5):
        while len(errors) < count:
            await anyio.sleep(0.02)


async def test_hub_config_refuses_clients_without_one_of_its_credentials(
    hub_nats: str, tmp_path: Path
) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the server closes an unauthenticated client
        await connect_tls(hub_nats)
    # A well-formed credential of another operator: the server trusts the generated one only.
    other = NatsAuthority.open(tmp_path / "other", int(time.time()))
    forged = other.issue("hub", identities.hub_permissions(), now=int(time.time())).creds
    with pytest.raises(Exception):  # noqa: B017
        await connect_tls(hub_nats, forged)
    hub = await connect_tls(hub_nats, creds_of("hub/hub-nats.yaml"), inbox_prefix="_INBOX.hub")
    await hub.close()


async def test_leaf_config_refuses_clients_without_tls(leaf_eu: str) -> None:
    plain = leaf_eu.replace("tls://", "nats://")
    with pytest.raises(Exception):  # noqa: B017 - the server requires TLS first
        await nats.connect(
            plain,
            user_credentials=RawCredentials(admin_creds("eu")),
            allow_reconnect=False,
            connect_timeout=2,
            tls=None,
        )


@asynccontextmanager
async def watcher_and_spoke(
    url: str, watcher_creds: str, spoke_secret: str, spoke_id: str, **watcher: Any
) -> AsyncIterator[tuple[Client, Client, list[str]]]:
    """A client with `watcher_creds` and the spoke `spoke_id` with its generated credential;
    the errors the server reported to the spoke."""
    errors: list[str] = []

    async def on_error(error: Exception) -> None:
        errors.append(str(error))

    watching = await connect_tls(url, watcher_creds, **watcher)
    spoke = await connect_tls(
        url, creds_of(spoke_secret), inbox_prefix=f"_INBOX_{spoke_id}", error_cb=on_error
    )
    try:
        yield watching, spoke, errors
    finally:
        await spoke.close()
        await watching.close()


@pytest.mark.parametrize(
    ("server", "spoke_id", "other"),
    [("hub_nats", "burst-1", "eu-west-1"), ("leaf_eu", "eu-west-1", "eu-central-1")],
)
async def test_a_spoke_is_confined_to_its_own_subjects(
    server: str, spoke_id: str, other: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(server)
    if server == "hub_nats":  # a spoke connecting to the hub directly; the hub watches
        watcher, secret, inbox = (
            creds_of("hub/hub-nats.yaml"),
            "hub/spoke-burst-1.yaml",
            "_INBOX.hub",
        )
    else:  # a spoke of region eu on its leaf; the region's admin watches
        watcher, secret, inbox = admin_creds("eu"), f"regions/eu/spoke-{spoke_id}.yaml", "_INBOX"
    mine, theirs = f"gpufed.v1.spoke.{spoke_id}", f"gpufed.v1.spoke.{other}"
    async with watcher_and_spoke(url, watcher, secret, spoke_id, inbox_prefix=inbox) as (
        watching,
        spoke,
        errors,
    ):
        seen = await watching.subscribe("gpufed.v1.spoke.>")
        await watching.flush()
        await spoke.publish(f"{mine}.capacity", b"mine")
        await spoke.publish(f"{theirs}.capacity", b"not mine")
        await spoke.subscribe(f"{mine}.commands")
        await spoke.flush()
        first = await seen.next_msg(timeout=2)
        await wait_for_errors(errors, 2)

        assert (first.subject, first.data) == (f"{mine}.capacity", b"mine")
        with pytest.raises(nats.errors.TimeoutError):
            await seen.next_msg(timeout=0.3)
        text = " ".join(errors).lower()
        assert f'permissions violation for publish to "{theirs}.capacity"' in text
        assert f'permissions violation for subscription to "{mine}.commands"' in text


async def test_leaf_config_lets_a_spoke_answer_log_requests_for_itself_only(
    leaf_eu: str,
) -> None:
    async def answer(msg: Any) -> None:
        await msg.respond(b"the tail")

    async with watcher_and_spoke(
        leaf_eu, admin_creds("eu"), "regions/eu/spoke-eu-west-1.yaml", "eu-west-1"
    ) as (admin, spoke, errors):
        await spoke.subscribe("gpufed.v1.spoke.eu-west-1.logs", cb=answer)
        await spoke.subscribe("gpufed.v1.spoke.eu-central-1.logs", cb=answer)
        await spoke.flush()
        reply = await admin.request("gpufed.v1.spoke.eu-west-1.logs", b"tail", timeout=2)
        assert reply.data == b"the tail"
        with pytest.raises((nats.errors.NoRespondersError, nats.errors.TimeoutError)):
            await admin.request("gpufed.v1.spoke.eu-central-1.logs", b"tail", timeout=0.5)
        assert any(
            'subscription to "gpufed.v1.spoke.eu-central-1.logs"' in e.lower() for e in errors
        )


async def test_leaf_config_lets_a_spoke_consume_only_its_own_commands(leaf_eu: str) -> None:
    async with watcher_and_spoke(
        leaf_eu, admin_creds("eu"), "regions/eu/spoke-eu-west-1.yaml", "eu-west-1"
    ) as (admin, spoke, errors):
        admin_js = admin.jetstream(timeout=2)
        await admin_js.add_stream(name="GPUFED_COMMANDS", subjects=["gpufed.v1.spoke.*.commands"])
        await admin_js.publish("gpufed.v1.spoke.eu-west-1.commands", b"place wl-1")
        await admin_js.publish("gpufed.v1.spoke.eu-central-1.commands", b"place wl-2")
        js = spoke.jetstream(timeout=0.5)

        # What the spoke's bus does: create its durable consumer on first start, then fetch.
        own = await js.pull_subscribe(
            "gpufed.v1.spoke.eu-west-1.commands",
            durable="spoke-eu-west-1",
            stream="GPUFED_COMMANDS",
        )
        [command] = await own.fetch(1, timeout=2)
        await command.ack_sync()
        with pytest.raises(nats.errors.TimeoutError):
            await js.pull_subscribe(
                "gpufed.v1.spoke.eu-central-1.commands",
                durable="spoke-eu-central-1",
                stream="GPUFED_COMMANDS",
            )

        assert command.data == b"place wl-1"
        assert any("permissions violation" in e.lower() for e in errors)


async def test_the_burst_secret_joins_the_hub_and_mints_and_revokes_instance_credentials(
    hub_nats: str, tmp_path: Path
) -> None:
    """What deploy/base/burst mounts, against the shipped hub config: the controller's own
    credential is accepted, and its issuer's instance credentials work until revoked."""
    data = secret_data("hub/burst-nats.yaml")
    controller = await connect_tls(
        hub_nats, data["creds"], inbox_prefix=identities.inbox_prefix(identities.BURST)
    )
    await controller.flush()
    assert controller.is_connected
    issuer_file = tmp_path / "issuer"
    issuer_file.write_text(data["issuer"])
    issuer = InstanceIssuer(issuer_file, hub_nats, tls_ca=str(tls_dir_for_tests() / "ca.crt"))
    creds = issuer.mint("burst-9-0-ab", time.time())
    inbox = identities.inbox_prefix("burst-9-0-ab")
    instance = await connect_tls(hub_nats, creds, inbox_prefix=inbox)
    await instance.flush()
    assert instance.is_connected

    await issuer.revoke(["burst-9-0-ab"], time.time())
    with anyio.fail_after(5):
        while not instance.is_closed:  # cut off at once
            await anyio.sleep(0.02)
    await assert_refused(hub_nats, creds, inbox_prefix=inbox)
    await controller.close()
