"""The test run that tests/integration/test_sigterm.py stops with SIGTERM (not collected by
itself: its name is not `test_*`). It starts a hub and its nats-server, writes the server's pid
to `$SIGTERM_CHILD_PID_FILE` and waits; with `$SIGTERM_CHILD_SERVE` set it waits while the
hub's API serves over HTTP (uvicorn)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

from bus.natsserver import EmbeddedNats
from tests.integration.fed import InProcessFederation


async def test_waits_to_be_stopped(fed: InProcessFederation, secure_nats: EmbeddedNats) -> None:
    await fed.start_hub()
    serving = fed.serve() if os.environ.get("SIGTERM_CHILD_SERVE") else contextlib.nullcontext()
    async with serving:
        pid_file = Path(os.environ["SIGTERM_CHILD_PID_FILE"])
        await asyncio.to_thread(pid_file.write_text, str(secure_nats.pid))
        await asyncio.sleep(120)
