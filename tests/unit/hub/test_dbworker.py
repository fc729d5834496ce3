"""The hub's store thread: calls run one at a time in the order made, each caller gets its own
result or error, and a cancelled caller still waits for its call (no write left running)."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest

from hub.dbworker import DbWorker


def test_calls_run_one_at_a_time_in_order_off_the_event_loop() -> None:
    worker = DbWorker()
    ran: list[int] = []
    running = threading.Semaphore(1)
    loop_thread = threading.get_ident()

    def call(n: int) -> int:
        assert running.acquire(blocking=False), "two calls at once"
        try:
            assert threading.get_ident() != loop_thread
            ran.append(n)
            return n * 10
        finally:
            running.release()

    async def main() -> list[int]:
        return list(
            await asyncio.gather(*(worker.call(functools.partial(call, n)) for n in range(50)))
        )

    assert asyncio.run(main()) == [n * 10 for n in range(50)]
    assert ran == list(range(50))


def test_an_error_reaches_its_own_caller_and_later_calls_still_run() -> None:
    worker = DbWorker()

    def fail() -> None:
        raise ValueError("disk full")

    async def main() -> list[object]:
        return list(
            await asyncio.gather(
                worker.call(lambda: 1),
                worker.call(fail),
                worker.call(lambda: 3),
                return_exceptions=True,
            )
        )

    first, second, third = asyncio.run(main())
    assert first == 1 and third == 3
    assert isinstance(second, ValueError)


def test_a_cancelled_caller_returns_only_once_its_call_has_run() -> None:
    worker = DbWorker()
    started = threading.Event()
    release = threading.Event()
    finished: list[str] = []

    def slow_write() -> None:
        started.set()
        release.wait(5)
        finished.append("written")

    async def main() -> None:
        task = asyncio.create_task(worker.call(slow_write))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()  # still waiting for the write
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert finished == ["written"]

    asyncio.run(main())


def test_the_worker_serves_a_new_event_loop_after_the_last_one_closed() -> None:
    worker = DbWorker()
    assert asyncio.run(worker.call(lambda: "first")) == "first"
    assert asyncio.run(worker.call(lambda: "second")) == "second"


def _queued_behind_a_blocker(
    worker: DbWorker, names: list[str], merged: list[list[str]]
) -> list[object]:
    """Make calls named `names` while the worker is busy, so they wait together (a name
    starting with "bad" fails)."""
    started = threading.Event()
    release = threading.Event()
    done: list[str] = []

    def merge(parts: list[str]) -> None:
        if any(part.startswith("bad") for part in parts):
            raise ValueError("one part is bad")
        merged.append(parts)

    def alone(name: str) -> str:
        if name.startswith("bad"):
            raise ValueError(name)
        done.append(name)
        return name

    def blocker() -> None:
        started.set()
        release.wait(5)

    async def main() -> list[object]:
        first = asyncio.create_task(worker.call(blocker))
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 5)
        tasks = [
            asyncio.create_task(worker.call(functools.partial(alone, name), merge, name))
            for name in names
        ]
        await asyncio.sleep(0)  # every call queued (the worker is still busy)
        release.set()
        await first
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    return asyncio.run(main())


def test_saves_waiting_together_run_as_one() -> None:
    merged: list[list[str]] = []
    results = _queued_behind_a_blocker(DbWorker(), ["a", "b", "c"], merged)
    assert merged == [["a", "b", "c"]]
    assert results == [None, None, None]


def test_when_the_merged_call_fails_each_runs_alone_and_only_the_bad_one_fails() -> None:
    merged: list[list[str]] = []
    results = _queued_behind_a_blocker(DbWorker(), ["a", "bad-b", "c"], merged)
    assert merged == []
    assert results[0] == "a" and results[2] == "c"
    assert isinstance(results[1], ValueError)
