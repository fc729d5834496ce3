"""JetStream publishes in flight together, each retried under its own Nats-Msg-Id until acked.

`Bus.publish_durable` awaits one publish's ack before it returns; a caller with many messages
(the hub's Place commands of one cycle) would otherwise run a task, a request future and a
timer per message. Here every message of a batch is written at once, the server's acks come
back on one reply subscription (nats-py's `publish_async`), and one wait with one timeout
covers the batch; those that failed or got no ack in time are sent again, under the same ids.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import nats.errors
import nats.js.errors
import structlog
from nats.js import JetStreamContext
from nats.js.api import PubAck

log = structlog.get_logger(__name__)

#: (subject, payload, Nats-Msg-Id)
Durable = tuple[str, bytes, str]


async def publish_all(
    js: JetStreamContext,
    messages: Sequence[Durable],
    *,
    timeout_s: float,
    give_up_after_s: float | None = None,
) -> list[PubAck]:
    """Publish `messages` to JetStream; their acks, in order.

    A message is retried, with the same Nats-Msg-Id (the server drops a repeat and its ack
    says duplicate=True), until the server acks it, or until `give_up_after_s` (default:
    never), when the last error is raised. A message the server refuses itself
    (`BadRequestError`) raises at once: a retry would be refused too.
    """
    loop = asyncio.get_running_loop()
    deadline = None if give_up_after_s is None else loop.time() + give_up_after_s
    acks: list[PubAck | None] = [None] * len(messages)
    todo = list(range(len(messages)))
    delay = 0.05
    while todo:
        sent: dict[int, asyncio.Future[PubAck]] = {}
        error: BaseException | None = None
        for i in todo:
            subject, payload, msg_id = messages[i]
            try:
                sent[i] = await js.publish_async(subject, payload, headers={"Nats-Msg-Id": msg_id})
            except (OSError, nats.errors.Error) as exc:  # closed, or the buffer is full
                error = exc
        if sent:
            try:
                await asyncio.wait(sent.values(), timeout=timeout_s)
            except BaseException:  # cancelled: free nats-py's slots of what is still waiting
                _cancel(sent)
                raise
        failed: list[int] = [i for i in todo if i not in sent]
        for i, future in sent.items():
            if not future.done():
                future.cancel()  # frees nats-py's slot; the retry gets a new reply subject
                failed.append(i)
                error = error or TimeoutError(f"no ack within {timeout_s}s")
                continue
            refused = future.exception()
            if refused is None:
                acks[i] = future.result()
            elif isinstance(refused, nats.js.errors.BadRequestError):
                _cancel(sent)
                raise refused
            else:
                failed.append(i)
                error = refused
        if not failed:
            break
        # Everything else is the server or the link being away, restarting or not yet serving
        # the stream (503, 500, no responders, a stream not recovered yet).
        assert error is not None
        if deadline is not None and loop.time() > deadline:
            raise error
        subject, _, msg_id = messages[failed[0]]
        log.warning(
            "publish_retry",
            subject=subject,
            msg_id=msg_id,
            count=len(failed),
            error=describe(error),
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
        todo = sorted(failed)
    return [ack for ack in acks if ack is not None]


def _cancel(futures: dict[int, asyncio.Future[PubAck]]) -> None:
    for future in futures.values():
        if not future.done():
            future.cancel()
        elif not future.cancelled():
            future.exception()  # retrieved: asyncio would warn about it otherwise


def describe(exc: BaseException) -> str:
    """`Type: message` of an exception, or the type alone when it has no message."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
