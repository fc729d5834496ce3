"""Long-running tasks of a daemon that never die silently.

A service gathers its tasks only when it stops; until then a task that ended with an exception
goes unnoticed while everything else looks healthy (the hub's event consumer once died on a
timed-out consumer creation and the hub never heard another event). `supervise` logs such an
end at once, with the exception, under the task's name.

Most such tasks are loops that do their work and then `pause` until the next round, cut short
when the service stops.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)

T = TypeVar("T")
#: How long `unless_stopped` gives a cancelled step before it cancels it again.
_RECANCEL_S = 0.5


def supervise(coro: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
    """Run `coro` as a task named `name`; if it ends with an exception, log it right away."""
    task = asyncio.create_task(coro, name=name)
    task.add_done_callback(_report_death)
    return task


def _report_death(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()  # also marks it retrieved: the gather at shutdown still sees it
    if exc is not None:
        log.error(
            "task_died", task=task.get_name(), error=f"{type(exc).__name__}: {exc}", exc_info=exc
        )


async def pause(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if `stop` is set meanwhile: the wait between a loop's rounds.

    `asyncio.timeout` rather than `asyncio.wait_for`: no task of its own for every wait."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


async def unless_stopped(coro: Coroutine[Any, Any, Any], stop: asyncio.Event) -> bool:
    """Run `coro` until it ends or `stop` is set, whichever comes first; True if it ended
    (its exception, if any, is raised), False if `stop` cut it short (it is cancelled).

    For steps that retry for ever, such as a first connect to a NATS server that is not
    there: a daemon told to stop meanwhile exits instead of waiting for it."""
    task = asyncio.create_task(coro)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()  # the caller itself was cancelled: take the step along
        raise
    finally:
        stopped.cancel()
    if task.done():
        task.result()
        return True
    # Cancelled again until it ends: nats-py's connect retry loop can swallow a cancellation
    # (asyncio.wait_for turns one that meets its timeout into a TimeoutError it retries on).
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=_RECANCEL_S)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()
    return False
