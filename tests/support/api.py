"""Waiting on a hub's REST API as a user would: until spokes are ready, until work has ended."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx

from tests.support.wait import wait_until

TERMINAL = {"succeeded", "failed", "cancelled"}


async def wait_http(client: httpx.AsyncClient, spokes: set[str], timeout: float = 30) -> None:
    """Until the hub answers and the given spokes are ready."""

    async def ready() -> bool:
        try:
            listed = (await client.get("/v1/spokes")).json()
        except httpx.TransportError:
            return False
        return spokes <= {s["id"] for s in listed if s["status"] == "ready"}

    await wait_until(ready, timeout, f"spokes {sorted(spokes)} to be ready", every=0.2)


async def wait_terminal(
    client: httpx.AsyncClient, ids: set[str], timeout: float
) -> dict[str, dict[str, Any]]:
    """Until every workload of `ids` has ended; their records by id."""
    records: dict[str, dict[str, Any]] = {}

    async def ended() -> bool:
        try:
            listed = (await client.get("/v1/workloads", params={"limit": 5000})).json()
        except httpx.TransportError:
            return False
        records.clear()
        records.update({r["id"]: r for r in listed if r["id"] in ids})
        return len(records) == len(ids) and all(r["phase"] in TERMINAL for r in records.values())

    try:
        await wait_until(ended, timeout, f"{len(ids)} workloads to end", every=0.25)
    except AssertionError as exc:
        phases = Counter(r["phase"] for r in records.values())
        raise AssertionError(f"{exc}; phases now {dict(phases)}") from None
    return records
