"""The one way tests wait: poll a condition until it holds, or fail saying what never happened.

No test sleeps for a fixed time hoping something happened; `timeout` only bounds a hang.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

Condition = Callable[[], bool | Awaitable[bool]]


async def wait_until(
    cond: Condition, timeout: float = 10.0, what: str = "the condition", every: float = 0.02
) -> None:
    """Poll `cond` (plain or async) every `every` s until true; AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        held = cond()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(every)


def wait_until_sync(
    cond: Callable[[], bool], timeout: float = 10.0, what: str = "the condition", every: float = 0.1
) -> None:
    """`wait_until` for tests that run no event loop of their own."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)
