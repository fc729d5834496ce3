"""A NATS connection set up for daemons, and JetStream publishing that never loses a message."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import nats
import nats.errors
import nats.js.errors
import structlog
from nats.aio.client import RawCredentials
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ExternalStream,
    PubAck,
    StreamConfig,
    StreamSource,
    SubjectTransform,
)

from bus import natsclient
from bus.durable import Durable, describe, publish_all
from bus.loglines import RepeatedLines
from bus.pull import PULL_EXPIRES_S, Puller, open_puller
from bus.streams import DUPLICATE_WINDOW_S as DUPLICATE_WINDOW_S
from bus.streams import stream_configs
from bus.tasks import pause
from bus.tls import client_context
from bus.urls import mask_url as mask_url
from schemas import subjects

log = structlog.get_logger(__name__)


def _mtime(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


#: Most messages a durable consumer fetches per round trip (it takes what is there, up to this).
FETCH_BATCH = 256


@dataclass(frozen=True, slots=True)
class BusSettings:
    """How a long-running process talks to NATS; the defaults fit daemons.

    nats-py pings every 120 s by default, so a half-open connection would go unnoticed for
    minutes; 15 s with 3 outstanding pings notices one within a minute.
    """

    url: str = "nats://127.0.0.1:4222"
    name: str = "gpufed"
    ping_interval_s: float = 15.0
    max_outstanding_pings: int = 3
    connect_timeout_s: float = 2.0
    publish_timeout_s: float = 2.0
    #: A `.creds` file (path), or the creds text itself as `nats.aio.client.RawCredentials`.
    user_credentials: str | RawCredentials | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    inbox_prefix: str | None = None
    #: CA file that signed the server's certificate (for tls:// URLs); None: the system's CAs.
    tls_ca: str | None = None
    #: How often a creds file is checked for a renewed credential (then the bus reconnects).
    creds_poll_s: float = 5.0


class Bus:
    """Our view of NATS: connect with retries, publish core or JetStream, consume durably."""

    def __init__(self, settings: BusSettings) -> None:
        self.settings = settings
        self._nc: natsclient.Client | None = None
        self._js: JetStreamContext | None = None
        self.connected = asyncio.Event()
        self.reconnected = asyncio.Event()  # set on every reconnect; whoever reacts clears it
        self._creds_watch: asyncio.Task[None] | None = None
        self.reconnects = 0  # since this process started (exported as a metric)
        self.error_lines = RepeatedLines()  # nats_error: each text once, then every 30 s

    @property
    def nc(self) -> natsclient.Client:
        if self._nc is None:
            raise RuntimeError("bus not connected")
        return self._nc

    def hold_reads(self, until: float) -> None:
        """Read nothing from NATS before loop time `until` (`natsclient.Client.hold_reads`)."""
        if self._nc is not None:
            self._nc.hold_reads(until)

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("bus not connected")
        return self._js

    async def connect(self, first_attempt_timeout_s: float | None = None) -> None:
        """Connect, retrying until it works (the client does not retry its first connect).

        Afterwards the client reconnects forever on its own.
        """
        s = self.settings
        delay = 0.1
        loop = asyncio.get_running_loop()
        deadline = (
            None if first_attempt_timeout_s is None else loop.time() + first_attempt_timeout_s
        )
        while True:
            try:
                kwargs: dict[str, object] = {}
                if s.user_credentials:
                    kwargs["user_credentials"] = s.user_credentials
                if s.token:
                    kwargs["token"] = s.token
                if s.inbox_prefix:
                    kwargs["inbox_prefix"] = s.inbox_prefix
                if s.tls_ca:
                    kwargs["tls"] = client_context(s.tls_ca)
                self._nc = await natsclient.connect(
                    s.url,
                    name=s.name,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    ping_interval=s.ping_interval_s,
                    max_outstanding_pings=s.max_outstanding_pings,
                    connect_timeout=s.connect_timeout_s,
                    allow_reconnect=True,
                    error_cb=self._on_error,
                    disconnected_cb=self._on_disconnect,
                    reconnected_cb=self._on_reconnect,
                    closed_cb=self._on_closed,
                    **kwargs,
                )
                break
            except (TimeoutError, OSError, nats.errors.Error) as exc:
                if deadline is not None and loop.time() > deadline:
                    raise
                log.warning(
                    "nats_connect_retry",
                    url=mask_url(s.url),
                    error=mask_url(str(exc)),
                    delay_s=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self._js = self._nc.jetstream(timeout=s.publish_timeout_s)
        if isinstance(s.user_credentials, str) and self._creds_watch is None:
            self._creds_watch = asyncio.create_task(
                self._watch_credentials(s.user_credentials, s.creds_poll_s)
            )
        self.connected.set()
        log.info("nats_connected", url=mask_url(s.url), name=s.name)

    async def close(self) -> None:
        """Flush what is buffered and close (no drain: a pending pull would stall it)."""
        if self._creds_watch is not None:
            self._creds_watch.cancel()
            self._creds_watch = None
        nc, self._nc = self._nc, None
        if nc is None or nc.is_closed:
            return
        with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
            await nc.flush(timeout=1)
        await nc.close()

    async def publish(self, subject: str, payload: bytes, reply: str = "") -> None:
        """Core NATS publish: at most once, for data that a newer message supersedes."""
        await self.nc.publish(subject, payload, reply=reply)

    async def publish_durable(
        self,
        subject: str,
        payload: bytes,
        msg_id: str,
        *,
        give_up_after_s: float | None = None,
    ) -> PubAck:
        """JetStream publish, retried with the same Nats-Msg-Id until the server acks it.

        A publish that timed out may still have been stored, so retries reuse `msg_id` and the
        server drops the repeat (the ack then says duplicate=True). Retries stop after
        `give_up_after_s` (default: never).
        """
        loop = asyncio.get_running_loop()
        deadline = None if give_up_after_s is None else loop.time() + give_up_after_s
        delay = 0.05
        while True:
            try:
                return await self.js.publish(
                    subject,
                    payload,
                    timeout=self.settings.publish_timeout_s,
                    headers={"Nats-Msg-Id": msg_id},
                )
            except nats.js.errors.BadRequestError:
                raise  # the server refuses this message itself: a retry would be refused too
            except (TimeoutError, OSError, nats.errors.Error) as exc:
                # Everything else is the server or the link being away, restarting or not yet
                # serving the stream (503, 500, no responders, a stream not recovered yet).
                if deadline is not None and loop.time() > deadline:
                    raise
                log.warning("publish_retry", subject=subject, msg_id=msg_id, error=describe(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def publish_durable_many(
        self, messages: Sequence[Durable], *, give_up_after_s: float | None = None
    ) -> list[PubAck]:
        """`publish_durable` for many (subject, payload, msg_id): all in flight at once, each
        retried under its own id until acked; the acks in order (see `bus.durable`)."""
        if not messages:
            return []
        return await publish_all(
            self.js,
            messages,
            timeout_s=self.settings.publish_timeout_s,
            give_up_after_s=give_up_after_s,
        )

    async def respond(self, replies: Sequence[tuple[Msg, bytes]]) -> None:
        """Answer requests, (request, payload) each, in one write; a request with no reply
        subject gets no answer. One with headers is answered by `Msg.respond`, which sends them
        back with the answer."""
        plain: list[tuple[str, bytes]] = []
        for msg, data in replies:
            if msg.headers:
                await msg.respond(data)
            elif msg.reply:
                plain.append((msg.reply, data))
        await self.nc.publish_batch(plain)

    async def ack(self, msgs: Sequence[Msg]) -> None:
        """Ack JetStream messages (fire-and-forget, as `Msg.ack`), all in one write."""
        await self.nc.publish_batch([(msg.reply, b"") for msg in msgs if msg.reply])
        for msg in msgs:
            msg._ackd = True  # as Msg.ack() marks it: a second ack then raises

    async def ensure_streams(self, event_domains: tuple[str, ...] = ()) -> None:
        """Create or update gpufed's streams (idempotent; the hub calls it at start).

        `event_domains`: JetStream domains of regional leaf nodes whose event streams the hub's
        event stream sources (see ensure_regional_streams).
        """
        for config in stream_configs(event_domains):
            await self._put_stream(config)

    async def ensure_regional_streams(
        self, hub_domain: str, spokes: tuple[str, ...], *, wait_for_hub_s: float = 120.0
    ) -> None:
        """On a regional leaf node: mirror the region's commands, keep its events locally.

        GPUFED_COMMANDS here mirrors the hub's (domain `hub_domain`), only the subjects of
        `spokes`; GPUFED_EVENTS here stores the region's events, and the hub's GPUFED_EVENTS
        sources it. Spokes on the leaf use both under the usual names and keep working while
        the WAN is down; each backlog flows once the link is back. Idempotent.

        The mirror is created only once the hub's stream answers through the leaf link (up to
        `wait_for_hub_s`, else TimeoutError): a mirror created before its origin exists, or
        before the leaf has linked up, fails its first consumer request and nats-server tries
        again only after a back-off of 10 s or more that grows with each failure, so the
        region's first commands could wait a minute. The event stream has no such dependency
        and is created first, so the hub's source finds it as soon as possible.
        """
        if not spokes:
            raise ValueError("a region needs at least one spoke")
        await self._put_stream(
            StreamConfig(
                name=subjects.EVENTS_STREAM,
                subjects=[subjects.events(s) for s in spokes],
                duplicate_window=DUPLICATE_WINDOW_S,
                max_age=7 * 24 * 3600.0,
            )
        )
        await self._wait_for_origin(hub_domain, subjects.COMMANDS_STREAM, wait_for_hub_s)
        commands = [subjects.commands(s) for s in spokes]
        await self._put_stream(
            StreamConfig(
                name=subjects.COMMANDS_STREAM,
                mirror=StreamSource(
                    name=subjects.COMMANDS_STREAM,
                    external=ExternalStream(api=f"$JS.{hub_domain}.API"),
                    subject_transforms=[SubjectTransform(src=c, dest=c) for c in commands],
                ),
                max_age=7 * 24 * 3600.0,
            )
        )

    async def _wait_for_origin(self, domain: str, stream: str, timeout_s: float) -> None:
        """Block until `stream` of JetStream domain `domain` answers (bounded by `timeout_s`)."""
        remote = self.nc.jetstream(domain=domain, timeout=self.settings.publish_timeout_s)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay = 0.1
        while True:
            try:
                await remote.stream_info(stream)
                return
            except (TimeoutError, nats.errors.Error) as exc:
                # NotFoundError: the hub has not created it yet; a timeout or no responders:
                # the leaf is not linked to the hub (yet), or the hub's JetStream is not up.
                if loop.time() + delay > deadline:
                    missing = isinstance(exc, nats.js.errors.NotFoundError)
                    why = "does not exist" if missing else "got no answer from JetStream there"
                    raise TimeoutError(
                        f"the hub's stream {stream} (JetStream domain {domain!r}) {why} after"
                        f" {timeout_s:.0f}s: is the hub running, and is this leaf node linked"
                        " to it?"
                    ) from exc
                log.info("waiting_for_hub_stream", stream=stream, domain=domain)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _put_stream(self, config: StreamConfig) -> None:
        try:
            await self.js.add_stream(config)
        except nats.js.errors.BadRequestError:
            await self.js.update_stream(config)
        log.info("stream_ready", stream=config.name)

    async def wait_for_stream(self, name: str, stop: asyncio.Event | None = None) -> None:
        """Block until stream `name` exists (a spoke started before the hub waits here), or
        until `stop` is set: the caller sees which."""
        delay = 0.1
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                await self.js.stream_info(name)
                return
            except (TimeoutError, nats.js.errors.NotFoundError, nats.errors.TimeoutError):
                log.info("waiting_for_stream", stream=name)
                await pause(stop, delay)
                delay = min(delay * 2, 2.0)

    async def consume(
        self,
        stream: str,
        durable: str,
        filter_subject: str,
        handler: Callable[[Msg], Awaitable[None]],
        stop: asyncio.Event,
        *,
        ack_wait_s: float = 30.0,
        batch: int = FETCH_BATCH,
        linger_s: float = 0.0,
    ) -> None:
        """Feed a durable pull consumer's messages to `handler`, one at a time, until `stop`.

        The handler acks (after it has applied the message) or naks; a handler that raises gets
        the message redelivered after `ack_wait_s`. Messages are fetched up to `batch` at a
        time (what is there, without waiting for more), so a busy stream costs one round trip
        per batch, not per message; `linger_s` as in `consume_batches`.
        """

        async def one_by_one(msgs: list[Msg]) -> None:
            for msg in msgs:
                try:
                    await handler(msg)
                except Exception:
                    log.exception("message_handler_failed", subject=msg.subject)

        await self.consume_batches(
            stream,
            durable,
            filter_subject,
            one_by_one,
            stop,
            ack_wait_s=ack_wait_s,
            batch=batch,
            linger_s=linger_s,
        )

    async def consume_batches(
        self,
        stream: str,
        durable: str,
        filter_subject: str,
        handler: Callable[[list[Msg]], Awaitable[None]],
        stop: asyncio.Event,
        *,
        ack_wait_s: float = 30.0,
        batch: int = FETCH_BATCH,
        linger_s: float = 0.0,
    ) -> None:
        """Feed a durable pull consumer's messages to `handler` as lists, in stream order.

        Each list is what has arrived, up to `batch` (`bus.pull`: one pull request stays open
        and the server pushes onto it): the handler applies them together (one store
        transaction, say) and acks each; what it does not ack comes back after `ack_wait_s`.

        `linger_s`: after a list shorter than `batch`, the next is taken no sooner than this
        after the last one was. Handling a list and its acks cost the same for one message
        as for a hundred: a consumer that keeps up with a steady stream would otherwise pay
        them for nearly every message. A message that finds the consumer idle is handled at
        once; one that arrives during a batch waits at most this long more.
        """
        config = ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s,
            max_ack_pending=1000,
            filter_subject=filter_subject,
        )
        puller: Puller | None = None
        delay = 0.1
        loop = asyncio.get_running_loop()
        fetched_at = 0.0
        try:
            while not stop.is_set():
                try:
                    if puller is None:
                        puller = await open_puller(
                            self.js, self.nc, stream, filter_subject, config, batch, PULL_EXPIRES_S
                        )
                    fetched_at = loop.time()
                    msgs = await puller.take(batch, timeout_s=1.0)
                    delay = 0.1
                except TimeoutError as exc:
                    # The consumer lookup or creation timed out: a server slow under load (it
                    # may yet create it; the next try finds it). Once the task's silent end.
                    log.warning("consumer_subscribe_retry", durable=durable, error=describe(exc))
                    continue
                except nats.js.errors.BadRequestError:
                    raise  # our consumer config is wrong: a retry cannot fix it
                except (OSError, nats.errors.Error) as exc:
                    # The consumer does not answer: the server is shutting down (a pull meets
                    # "no responders"), restarting, or lost the consumer. Never give up (a dead
                    # loop stops the flow unseen): subscribe afresh, recreating the consumer.
                    log.warning("consumer_retry", durable=durable, error=describe(exc))
                    if puller is not None:
                        with contextlib.suppress(Exception):
                            await puller.stop()
                        puller = None
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                if not msgs:
                    continue  # nothing arrived
                try:
                    await handler(msgs)
                except Exception:
                    log.exception(
                        "message_handler_failed", subject=msgs[0].subject, count=len(msgs)
                    )
                if linger_s > 0 and len(msgs) < batch:
                    rest = fetched_at + linger_s - loop.time()
                    if rest > 0:
                        await asyncio.sleep(rest)
        finally:
            if puller is not None:
                with contextlib.suppress(Exception):
                    await puller.stop()

    async def _watch_credentials(self, path: str, every_s: float) -> None:
        """Reconnect when the creds file is replaced (renewed before it expires).

        The client reads the file on every (re)connect; a renewed credential only takes effect
        on a new connection, and the server closes one whose JWT expired for good.
        """
        seen = _mtime(path)
        while True:
            await asyncio.sleep(every_s)
            now = _mtime(path)
            if now == seen or now is None:
                continue
            seen = now
            nc = self._nc
            if nc is not None and nc.is_connected:
                log.info("nats_credentials_renewed", name=self.settings.name)
                await nc.force_reconnect()

    # --- connection callbacks: NATS reports permission denials only here ---

    async def _on_error(self, exc: Exception) -> None:
        error = mask_url(str(exc)) or type(exc).__name__  # a refused server: retried for ever
        if (held := self.error_lines.allow(error, asyncio.get_running_loop().time())) is not None:
            log.warning("nats_error", error=error, held_back=held)

    async def _on_disconnect(self) -> None:
        self.connected.clear()
        log.warning("nats_disconnected", url=mask_url(self.settings.url))

    async def _on_reconnect(self) -> None:
        self.connected.set()
        self.reconnects += 1
        self.reconnected.set()
        log.info("nats_reconnected", url=mask_url(self.settings.url))

    async def _on_closed(self) -> None:
        self.connected.clear()
