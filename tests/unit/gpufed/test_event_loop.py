"""The hub's event loop: uvloop where installed, the standard one when asked."""

from __future__ import annotations

import asyncio

import pytest

from gpufed.compose import loop


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_the_hub_runs_on_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUFED_EVENT_LOOP", raising=False)
    assert loop.run(loop_module()).startswith("uvloop")


def test_gpufed_event_loop_asyncio_keeps_the_standard_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUFED_EVENT_LOOP", "asyncio")
    assert loop.run(loop_module()).startswith("asyncio")
