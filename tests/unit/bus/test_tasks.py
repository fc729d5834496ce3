"""A daemon's task that dies says so at once, not when the daemon stops."""

from __future__ import annotations

import asyncio

import structlog

from bus.tasks import supervise
from tests.support.wait import wait_until


async def test_a_task_that_raises_is_logged_at_once_with_its_exception() -> None:
    async def consumer() -> None:
        raise TimeoutError("consumer creation timed out")

    with structlog.testing.capture_logs() as logs:
        task = supervise(consumer(), "hub-events")
        # Nobody awaits the task: the daemon gathers its tasks only when it stops.
        await wait_until(lambda: any(e["event"] == "task_died" for e in logs), what="task_died")
    died = next(e for e in logs if e["event"] == "task_died")
    assert died["task"] == "hub-events"
    assert died["error"] == "TimeoutError: consumer creation timed out"
    assert isinstance(task.exception(), TimeoutError)  # still there for the shutdown gather


async def test_a_cancelled_or_finished_task_is_not_reported() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async def done() -> None:
        return None

    with structlog.testing.capture_logs() as logs:
        cancelled, finished = supervise(forever(), "a"), supervise(done(), "b")
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.gather(cancelled, finished, return_exceptions=True)
        await asyncio.sleep(0)  # their done callbacks have run
    assert cancelled.cancelled() and finished.done()
    assert not [e for e in logs if e["event"] == "task_died"]
