"""Stop a piece on SIGINT/SIGTERM: the one signal hook of every `gpufed` process."""

from __future__ import annotations

import asyncio
import contextlib
import signal


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set `stop` on SIGINT or SIGTERM (a no-op off the main thread or without signals)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
