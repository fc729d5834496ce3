"""Confined NATS identities against a real nats-server in operator mode (as `gpufed up` runs it).

A spoke's credential may only speak for its own spoke id and read its own commands; a burst
instance's credential stops working once the instance is released (revoked) or its time is up.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client, RawCredentials
from nats.js.api import AckPolicy, ConsumerConfig

from bus import identities
from bus.authority import NatsAuthority, write_secret
from bus.client import Bus, BusSettings
from bus.issuer import InstanceIssuer
from bus.natsserver import EmbeddedNats
from schemas import subjects
from tests.support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.security]

Connect = Callable[..., Awaitable[tuple[Client, list[str]]]]


@pytest.fixture
async def hub_bus(secure_nats: EmbeddedNats) -> AsyncIterator[Bus]:
    """The hub's connection: streams exist, as in a running federation."""
    assert secure_nats.authority is not None
    issued = secure_nats.authority.issue("hub", identities.hub_permissions(), now=int(time.time()))
    bus = Bus(
        BusSettings(
            url=secure_nats.url,
            name="hub",
            user_credentials=RawCredentials(issued.creds),
            inbox_prefix=identities.inbox_prefix(identities.HUB),
        )
    )
    await bus.connect(first_attempt_timeout_s=5)
    await bus.ensure_streams()
    yield bus
    await bus.close()


@pytest.fixture
async def connect(secure_nats: EmbeddedNats) -> AsyncIterator[Connect]:
    """Connect with a creds text; returns the client and the errors the server reported."""
    clients: list[Client] = []

    async def make(creds: str, inbox: str) -> tuple[Client, list[str]]:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            secure_nats.url,
            user_credentials=RawCredentials(creds),
            inbox_prefix=inbox,
            error_cb=on_error,
            allow_reconnect=False,
            connect_timeout=3,
        )
        clients.append(nc)
        return nc, errors

    yield make
    for nc in clients:
        if not nc.is_closed:
            await nc.close()


def spoke_creds(authority: NatsAuthority | None, spoke_id: str) -> str:
    assert authority is not None
    permissions = identities.spoke_permissions(spoke_id)
    return authority.issue(f"spoke-{spoke_id}", permissions, now=int(time.time())).creds


async def test_a_spoke_cannot_speak_for_another_spoke(
    secure_nats: EmbeddedNats, hub_bus: Bus, connect: Connect
) -> None:
    heard: list[str] = []

    async def record(msg: nats.aio.msg.Msg) -> None:
        heard.append(msg.subject)

    await hub_bus.nc.subscribe(f"{subjects.PREFIX}.spoke.*.*", cb=record)
    await hub_bus.nc.flush()
    eu1, errors = await connect(
        spoke_creds(secure_nats.authority, "eu-1"), identities.inbox_prefix("eu-1")
    )
    forged = (subjects.events("eu-2"), subjects.capacity("eu-2"), subjects.commands("eu-1"))
    for subject in forged:
        await eu1.publish(subject, b'{"forged": true}')
    await eu1.publish(subjects.capacity("eu-1"), b"{}")  # its own subject: allowed
    await eu1.flush()
    await wait_until(lambda: subjects.capacity("eu-1") in heard and len(errors) >= 3)
    assert heard == [subjects.capacity("eu-1")]
    for subject in forged:
        assert any(f'publish to "{subject}"' in e for e in errors), errors
    # Nor may it read another spoke's commands directly, or everyone's replies.
    for subject in (subjects.commands("eu-2"), "_INBOX.>", f"{identities.inbox_prefix('eu-2')}.>"):
        await eu1.subscribe(subject)
    await eu1.flush()
    await wait_until(lambda: sum("subscription" in e for e in errors) >= 3)


async def test_a_spoke_cannot_consume_or_delete_another_spokes_commands(
    secure_nats: EmbeddedNats, hub_bus: Bus, connect: Connect
) -> None:
    eu1, _ = await connect(
        spoke_creds(secure_nats.authority, "eu-1"), identities.inbox_prefix("eu-1")
    )
    js = eu1.jetstream(timeout=1.5)
    stream = subjects.COMMANDS_STREAM

    def config(consumer: str, spoke_filter: str) -> ConsumerConfig:
        return ConsumerConfig(
            name=consumer,
            durable_name=consumer,
            ack_policy=AckPolicy.EXPLICIT,
            filter_subject=subjects.commands(spoke_filter),
        )

    # Its own durable on its own commands: allowed.
    own = await js.add_consumer(stream, config(subjects.spoke_consumer("eu-1"), "eu-1"))
    assert own.config.filter_subject == subjects.commands("eu-1")
    # Its own consumer name on eu-2's commands, eu-2's consumer, the legacy unfiltered API:
    # the server answers none of them (a denied API request is dropped).
    for consumer, spoke_filter in (
        (subjects.spoke_consumer("eu-1"), "eu-2"),
        (subjects.spoke_consumer("eu-2"), "eu-2"),
    ):
        with pytest.raises((TimeoutError, nats.errors.TimeoutError)):
            await js.add_consumer(stream, config(consumer, spoke_filter))
    with pytest.raises((TimeoutError, nats.errors.TimeoutError)):
        await eu1.request(
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.spoke-eu-1", b"{}", timeout=1.5
        )
    await hub_bus.js.add_consumer(stream, config(subjects.spoke_consumer("eu-2"), "eu-2"))
    with pytest.raises((TimeoutError, nats.errors.TimeoutError)):
        await js.delete_consumer(stream, subjects.spoke_consumer("eu-2"))
    with pytest.raises((TimeoutError, nats.errors.TimeoutError)):
        await js.delete_consumer(stream, subjects.spoke_consumer("eu-1"))
    names = {c.name for c in await hub_bus.js.consumers_info(stream)}
    assert names == {subjects.spoke_consumer("eu-1"), subjects.spoke_consumer("eu-2")}


async def test_a_spoke_reads_only_its_own_commands_through_the_bus(
    secure_nats: EmbeddedNats, hub_bus: Bus
) -> None:
    await hub_bus.publish_durable(subjects.commands("eu-2"), b"for eu-2", "c-eu-2")
    await hub_bus.publish_durable(subjects.commands("eu-1"), b"for eu-1", "c-eu-1")
    bus = Bus(
        BusSettings(
            url=secure_nats.url,
            user_credentials=RawCredentials(spoke_creds(secure_nats.authority, "eu-1")),
            inbox_prefix=identities.inbox_prefix("eu-1"),
        )
    )
    await bus.connect(first_attempt_timeout_s=5)
    got: list[bytes] = []
    stop = asyncio.Event()

    async def handle(msg: nats.aio.msg.Msg) -> None:
        got.append(msg.data)
        await msg.ack()
        stop.set()

    await asyncio.wait_for(
        bus.consume(
            subjects.COMMANDS_STREAM,
            subjects.spoke_consumer("eu-1"),
            subjects.commands("eu-1"),
            handle,
            stop,
        ),
        10,
    )
    assert got == [b"for eu-1"]
    await bus.close()


async def test_a_burst_credential_stops_working_when_released(
    secure_nats: EmbeddedNats, hub_bus: Bus, connect: Connect, tmp_path: Path
) -> None:
    assert secure_nats.authority is not None
    issuer_file = secure_nats.authority.write_issuer(tmp_path / "issuer.json", int(time.time()))
    issuer = InstanceIssuer(issuer_file, secure_nats.url, ttl_s=3600)
    creds = issuer.mint("burst-7-0-ab", time.time())
    other = issuer.mint("burst-7-1-cd", time.time())
    inbox = identities.inbox_prefix("burst-7-0-ab")
    nc, errors = await connect(creds, inbox)
    await nc.publish(subjects.capacity("burst-7-1-cd"), b"{}")  # confined like any spoke
    await nc.flush()
    await wait_until(lambda: any("burst-7-1-cd" in e for e in errors))

    await issuer.revoke(["burst-7-0-ab"], time.time())
    await wait_until(lambda: nc.is_closed)  # cut off at once
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await connect(creds, inbox)
    # The revocation survives a server restart (the resolver keeps the account update).
    secure_nats.stop()
    secure_nats.start()
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await connect(creds, inbox)
    # Another instance's credential is untouched.
    still, _ = await connect(other, identities.inbox_prefix("burst-7-1-cd"))
    assert still.is_connected


async def test_a_burst_credential_expires(
    secure_nats: EmbeddedNats, hub_bus: Bus, connect: Connect, tmp_path: Path
) -> None:
    assert secure_nats.authority is not None
    issuer_file = secure_nats.authority.write_issuer(tmp_path / "issuer.json", int(time.time()))
    issuer = InstanceIssuer(issuer_file, secure_nats.url, ttl_s=2)
    issued = issuer.issue("burst-8-0-ab", time.time())
    nc, _ = await connect(issued.creds, identities.inbox_prefix("burst-8-0-ab"))
    assert issued.expires_at is not None
    await wait_until(lambda: nc.is_closed, timeout=10)  # the server closes it at `exp`
    # The server compares whole seconds: once the second after `exp` began, it is refused.
    expired_at = issued.expires_at
    await wait_until(lambda: time.time() >= expired_at + 1, timeout=10)
    with pytest.raises(nats.errors.Error, match=r"Authorization Violation|Expired"):
        await connect(issued.creds, identities.inbox_prefix("burst-8-0-ab"))


async def test_a_renewed_credential_keeps_a_spoke_connected_past_the_first_expiry(
    secure_nats: EmbeddedNats, hub_bus: Bus, tmp_path: Path
) -> None:
    assert secure_nats.authority is not None
    issuer_file = secure_nats.authority.write_issuer(tmp_path / "issuer.json", int(time.time()))
    issuer = InstanceIssuer(issuer_file, secure_nats.url, ttl_s=3)
    first = issuer.issue("burst-9-0-ab", time.time())
    creds = write_secret(tmp_path / "creds" / "burst-9-0-ab.creds", first.creds)
    heard: list[bytes] = []

    async def record(msg: nats.aio.msg.Msg) -> None:
        heard.append(msg.data)

    await hub_bus.nc.subscribe(subjects.capacity("burst-9-0-ab"), cb=record)
    spoke = Bus(
        BusSettings(
            url=secure_nats.url,
            user_credentials=str(creds),
            inbox_prefix=identities.inbox_prefix("burst-9-0-ab"),
            creds_poll_s=0.1,
        )
    )
    await spoke.connect(first_attempt_timeout_s=5)
    await asyncio.sleep(1.1)  # a later second: the renewed JWT is a new one
    renewing = InstanceIssuer(issuer_file, secure_nats.url, ttl_s=60)
    write_secret(creds, renewing.mint("burst-9-0-ab", time.time()))  # what burst does
    assert first.expires_at is not None
    expired_at = first.expires_at
    await wait_until(lambda: time.time() >= expired_at + 1, timeout=10)
    await spoke.publish(subjects.capacity("burst-9-0-ab"), b"still here")
    await wait_until(lambda: heard == [b"still here"])
    await spoke.close()


async def test_no_credential_no_connection(secure_nats: EmbeddedNats) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(secure_nats.url, allow_reconnect=False, connect_timeout=3)
