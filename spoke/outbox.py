"""The spoke's event outbox: events go to JetStream in order, each until it is stored."""

from __future__ import annotations

import asyncio
import contextlib
import json

import structlog
from nats.aio.msg import Msg

from bus.client import Bus
from schemas.common import json_array, json_runs
from schemas.events import MAX_EVENTS_BYTES, MAX_EVENTS_PER_MESSAGE
from spoke.journal import Journal

log = structlog.get_logger(__name__)

#: Most events published together (pipelined: all sent, then all acks awaited).
OUTBOX_BATCH = 256
#: First and longest wait before a batch's unacknowledged events are published again.
RETRY_FIRST_S, RETRY_MAX_S = 0.05, 2.0
#: Wait before a batch the server refused (a 4xx: the message itself) is tried again.
REFUSED_RETRY_S = 5.0

#: (event id, JSON) of each event owed to the hub, in the order they happened.
Outbox = asyncio.Queue[tuple[str, bytes]]


async def publish_outbox(bus: Bus, journal: Journal, outbox: Outbox, subject: str) -> None:
    """Publish `outbox`'s events to `subject` for ever; never ends on an error.

    One publisher keeps events in order. What has queued up goes out together, in as few
    messages as fit (`schemas.common.json_array`: a JSON array of up to MAX_EVENTS_PER_MESSAGE):
    every message of a batch is written before any ack is awaited (pipelined), those not
    acked in time (or refused) are published again, the same message under the same
    Nats-Msg-Id, until JetStream has them, and the journal notes them delivered once all are.
    A loop that died would leave the hub deaf to this spoke while everything looked healthy:
    a batch the server refuses is retried slowly (the same ids: nothing is stored twice).
    """
    acks = _Acks(bus, subject)
    while True:
        batch = [await outbox.get()]
        while len(batch) < OUTBOX_BATCH and not outbox.empty():
            batch.append(outbox.get_nowait())
        journal.flush()  # what the hub hears of is on disk first
        owed, delay = messages_of(batch), RETRY_FIRST_S
        while owed:
            try:
                owed, refused = await acks.publish(owed, bus.settings.publish_timeout_s)
            except Exception as exc:  # not connected, closed, a full buffer: all again
                log.warning("event_publish_retry", messages=len(owed), error=str(exc) or repr(exc))
                refused = ""
            else:
                if not owed:
                    break
                log.warning("event_publish_retry", messages=len(owed), error=refused or "timeout")
            if refused.startswith("400"):  # the server refuses these messages themselves
                log.error("event_publish_refused", messages=len(owed), error=refused)
                await asyncio.sleep(REFUSED_RETRY_S)
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
        for event_id, _ in batch:
            journal.delivered(event_id)
            outbox.task_done()


#: (Nats-Msg-Id, payload) of one message of events.
Message = tuple[str, bytes]


def messages_of(events: list[tuple[str, bytes]]) -> list[Message]:
    """`events` (id, JSON) in order, as messages of up to MAX_EVENTS_PER_MESSAGE events and
    about MAX_EVENTS_BYTES each. A lone event is its own message under its own id; several go
    under `<first id>..<last id>`: the journal's order fixes what lies between, so a message
    published again after a restart under the same id holds the same events."""
    runs = json_runs([p for _, p in events], MAX_EVENTS_PER_MESSAGE, MAX_EVENTS_BYTES)
    return [_message(events[run]) for run in runs]


def _message(events: list[tuple[str, bytes]]) -> Message:
    msg_id = events[0][0] if len(events) == 1 else f"{events[0][0]}..{events[-1][0]}"
    return msg_id, json_array([payload for _, payload in events])


class _Acks:
    """Pipelined JetStream publishes to one subject, their acks on one inbox subscription.

    Leaner per message than a request each (`Bus.publish_durable`): no future, timer or task
    per publish, a counter for reply tokens, one wait for a whole batch.
    """

    def __init__(self, bus: Bus, subject: str) -> None:
        self._bus = bus
        self._subject = subject
        self._prefix = ""
        self._nc: object = None  # the client that holds the inbox subscription
        self._count = 0
        self._waiting: dict[str, Message] = {}  # reply token -> message
        self._refused: list[Message] = []
        self._error = ""
        self._all_in = asyncio.Event()

    async def publish(self, messages: list[Message], timeout_s: float) -> tuple[list[Message], str]:
        """Publish `messages`; those not stored within `timeout_s` (in order) and the last
        error the server gave ("" if none)."""
        nc = self._bus.nc
        if nc is not self._nc:  # (a bus connected afresh is a new client)
            prefix = nc.new_inbox()
            await nc.subscribe(f"{prefix}.*", cb=self._on_ack)
            self._prefix, self._nc = prefix, nc
        # Every token is noted before the first publish: acks come in while later ones go out.
        first = self._count + 1
        self._count += len(messages)
        waiting = {str(first + i): message for i, message in enumerate(messages)}
        self._waiting, self._refused, self._error = waiting, [], ""
        self._all_in.clear()
        for token, (msg_id, payload) in waiting.copy().items():
            await nc.publish(
                self._subject,
                payload,
                reply=f"{self._prefix}.{token}",
                headers={"Nats-Msg-Id": msg_id},
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._all_in.wait(), timeout_s)
        self._waiting = {}
        owed = {id(m) for m in waiting.values()} | {id(m) for m in self._refused}
        return [m for m in messages if id(m) in owed], self._error

    async def _on_ack(self, msg: Msg) -> None:
        message = self._waiting.pop(msg.subject.rpartition(".")[2], None)
        if message is None:
            return  # the ack of a batch given up on (its message was published again)
        error = _error_of(msg)
        if error:
            self._refused.append(message)
            self._error = error
        if not self._waiting:
            self._all_in.set()


def _error_of(msg: Msg) -> str:
    """ "" for a stored (or duplicate) message's ack; else the server's code and why."""
    if msg.headers and msg.headers.get("Status"):  # no responders: no stream (yet)
        return f"{msg.headers['Status']} {msg.headers.get('Description', 'no responders')}"
    if b'"error"' not in msg.data:
        return ""
    try:
        error = json.loads(msg.data)["error"]
        return f"{error.get('code', '')} {error.get('description', '')}".strip()
    except (ValueError, KeyError, TypeError, AttributeError):
        return "unreadable ack"


async def drain(outbox: Outbox, within_s: float) -> None:
    """Wait up to `within_s` for every queued event to be delivered."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(outbox.join(), within_s)
