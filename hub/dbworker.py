"""The thread that runs the hub's blocking store calls, one at a time, off the event loop.

A store call is a hop to this thread and back. `anyio.to_thread` costs about 50 µs of CPU a
hop (its limiter, cancel scope and worker queue), and under load the hub makes several hops a
workload; this worker costs about 15: a `SimpleQueue` in, and one `call_soon_threadsafe` back
for all the calls it ran since it last woke.

Calls made with the same `merge` function that are waiting together when the thread wakes run
as one (group commit): the hub's saves become one transaction, and each caller still returns
only once its part is committed. When the merged call fails, each runs alone, so an error
reaches only the caller whose part caused it.

As with `anyio.to_thread.run_sync`, a caller that is cancelled still waits until its call has
run (its write is never left running behind its back) and is then cancelled. The thread ends
after `IDLE_S` without a call, and starts again on the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: The thread ends after this long without a call.
IDLE_S = 10.0


class _Call:
    __slots__ = ("done", "error", "fn", "future", "loop", "merge", "part", "result")

    def __init__(
        self,
        fn: Callable[[], Any],
        loop: asyncio.AbstractEventLoop,
        merge: Callable[[list[Any]], Any] | None,
        part: Any,
    ) -> None:
        self.fn = fn
        self.loop = loop
        self.merge = merge
        self.part = part
        self.future: asyncio.Future[Any] = loop.create_future()
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False


class DbWorker:
    """Runs blocking calls in order on one thread of its own."""

    def __init__(self, name: str = "hub-store") -> None:
        self.name = name
        self._queue: queue.SimpleQueue[_Call] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the thread's coming and going
        self._running = False

    async def call(
        self,
        fn: Callable[[], T],
        merge: Callable[[list[Any]], Any] | None = None,
        part: Any = None,
    ) -> T:
        """`fn()` run on the worker thread, after every call queued before it.

        With `merge`: calls waiting next to each other with the same `merge` may instead run
        as `merge([part, ...])` (in the order made); each then returns None.
        """
        call = _Call(fn, asyncio.get_running_loop(), merge, part)
        with self._lock:
            self._queue.put(call)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name=self.name, daemon=True).start()
        try:
            return await call.future  # type: ignore[no-any-return]
        except asyncio.CancelledError:
            # Cancelled while it runs: wait for it (like anyio's uncancellable worker calls).
            while not call.done:
                call.future = call.loop.create_future()
                try:
                    await call.future
                except asyncio.CancelledError:
                    continue
                except BaseException:
                    break
            raise

    def _run(self) -> None:
        calls = self._queue
        while True:
            try:
                first = calls.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    if calls.empty():
                        self._running = False
                        return
                continue
            batch = [first]
            while True:
                try:
                    batch.append(calls.get_nowait())
                except queue.Empty:
                    break
            for group in _groups(batch):
                if len(group) > 1 and _run_merged(group):
                    continue
                for call in group:
                    try:
                        call.result = call.fn()
                    except BaseException as exc:  # handed to the caller
                        call.error = exc
            _settle_soon(batch)


def _groups(batch: list[_Call]) -> list[list[_Call]]:
    """Runs of consecutive calls that share their `merge` (a call without one is alone)."""
    groups: list[list[_Call]] = []
    for call in batch:
        if groups and call.merge is not None and groups[-1][0].merge is call.merge:
            groups[-1].append(call)
        else:
            groups.append([call])
    return groups


def _run_merged(group: list[_Call]) -> bool:
    """Run the group as one call; False (nothing done) if that failed."""
    merge = group[0].merge
    assert merge is not None
    try:
        merge([call.part for call in group])
    except Exception:
        return False
    return True


def _settle_soon(batch: list[_Call]) -> None:
    """Hand results back to their loops: one wake-up a loop, however many calls ran."""
    loops: dict[asyncio.AbstractEventLoop, list[_Call]] = {}
    for call in batch:
        loops.setdefault(call.loop, []).append(call)
    for loop, calls in loops.items():
        with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, calls)


def _settle(calls: list[_Call]) -> None:
    for call in calls:
        call.done = True
        future = call.future
        if future.done():  # its caller was cancelled (and waits on a new one, or left)
            continue
        if call.error is None:
            future.set_result(call.result)
        else:
            future.set_exception(call.error)
