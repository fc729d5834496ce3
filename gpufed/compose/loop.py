"""The event loop a `gpufed` service process runs on.

The hub runs on uvloop (libuv's loop, in C) where it is installed: every NATS message the hub
reads costs a few turns of the loop, and on uvloop the hub spent about a tenth less CPU per
workload at 400 submissions a second (docs/benchmarks.md). `GPUFED_EVENT_LOOP=asyncio` keeps
the standard loop. Spokes stay on the standard loop: their runtime watches its children with
pidfds and `os.waitpid` (spoke/runtime/spawn.py), which uvloop's own child handling would race.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop, unless GPUFED_EVENT_LOOP=asyncio or uvloop is not installed (None)."""
    if os.environ.get("GPUFED_EVENT_LOOP", "uvloop") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # a platform without it (Windows): the standard loop
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the loop `loop_factory` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
