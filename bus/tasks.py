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
