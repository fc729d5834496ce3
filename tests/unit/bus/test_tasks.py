"""A daemon's task that dies says so at once, not when the daemon stops; a loop's pause between
rounds ends when the daemon stops."""

from __future__ import annotations

import asyncio

import pytest
import structlog

from bus.tasks import pause, supervise
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


async def test_a_pause_ends_when_the_service_stops_not_at_the_end_of_its_interval() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    loop.call_later(0.05, stop.set)
    # A stopping service does not wait out an hour's pause (asyncio.wait_for: fail, not hang).
    await asyncio.wait_for(pause(stop, 3600), 30)
    assert stop.is_set() and loop.time() - started < 30


async def test_a_pause_lasts_its_interval_when_nothing_stops() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await pause(stop, 0.05)
    assert not stop.is_set()
    assert loop.time() - started > 0.04  # waited, not returned at once


async def test_a_cancelled_pause_is_cancelled_not_taken_for_its_end() -> None:
    task = asyncio.create_task(pause(asyncio.Event(), 3600))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
