"""Stop a piece on SIGINT/SIGTERM/SIGHUP: the one signal hook of every `gpufed` process."""

from __future__ import annotations

import asyncio
import contextlib
import signal


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set `stop` on SIGINT, SIGTERM or SIGHUP (a no-op off the main thread or without signals).

    SIGHUP (its terminal closed) would otherwise end the process on the spot, without stopping
    its workloads or flushing what it owes.
    """
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
