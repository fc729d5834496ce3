"""A live hub on a loopback port, and Debian's Chromium driven by Playwright (never downloaded)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from bus.natsserver import EmbeddedNats
from bus.ports import free_port
from hub.core.policy import Policy
from tests.integration.fed import InProcessFederation, InProcessServer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",  # root in a container has no user namespace for the sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


_SHOTS: list[Path] = []


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("console-screenshots")
    _SHOTS.append(path)
    return path


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Name the screenshot folder at the end of the run, captured output or not."""
    for path in _SHOTS:
        pngs = sorted(p.name for p in path.glob("*.png"))
        terminalreporter.write_line(f"console screenshots ({len(pngs)}): {path}")


@pytest.fixture
def chromium_path() -> str:
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip(
            "SKIPPED: /usr/bin/chromium not found - install Debian's chromium package "
            "(apt-get install chromium) to run the console's browser tests"
        )
    return CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(tmp_path / "nats").start()
    try:
        yield server
    finally:
        server.stop()


class LiveHub:
    """An in-process federation whose hub API also listens on a real loopback port."""

    def __init__(self, fed: InProcessFederation) -> None:
        self.fed = fed
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[Any] | None = None

    async def start(self, policy: Policy | None = None) -> None:
        self.fed.policy = policy
        await self.fed.start_hub()
        assert self.fed.app is not None  # the hub's own app: same tokens as fed.api
        config = uvicorn.Config(
            self.fed.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = InProcessServer(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._task, 10)


@pytest.fixture
async def live_hub(nats_server: EmbeddedNats, tmp_path: Path) -> AsyncIterator[LiveHub]:
    fed = InProcessFederation(nats_server.url, tmp_path)
    live = LiveHub(fed)
    try:
        yield live
    finally:
        await live.stop()
        await fed.close()


@pytest.fixture
async def browser_context(chromium_path: str, tmp_path: Path) -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        context = await p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),  # a fresh profile for every test
            executable_path=chromium_path,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            await context.close()
