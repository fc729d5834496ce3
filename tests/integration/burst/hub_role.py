"""The hub's side of the burst contract, played by a test over a real nats-server.

It creates the burst stream, answers `gpufed.v1.burst.state` with the latest event of every
instance it has read from the stream, publishes DemandReports like the hub does (at least every
`every_s`), and records every InstanceEvent and capacity report it sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

from burst.catalog import Catalog
from bus.client import DUPLICATE_WINDOW_S, Bus, BusSettings
from schemas import subjects
from schemas.burst import (
    BURST_DEMAND,
    BURST_INSTANCES,
    BURST_STATE,
    BURST_STREAM,
    BurstStateReply,
    DemandItem,
    DemandReport,
    InstanceEvent,
    InstanceState,
)
from schemas.capacity import CapacityReport

REGION = "us-east-1"


def sim_catalog(*types: tuple[str, str, int, float]) -> Catalog:
    """A catalog of simulated (name, gpu_model, gpu_count, on-demand $/h) in REGION."""
    return Catalog.model_validate(
        {
            "as_of": "2025-01-15",
            "source": "tests",
            "instance_types": [
                {
                    "name": name,
                    "gpu_model": model,
                    "gpu_count": count,
                    "gpu_memory_gib": 24,
                    "vcpus": 4 * count,
                    "prices": {REGION: {"on_demand": price}},
                }
                for name, model, count, price in types
            ],
        }
    )


class HubRole:
    """What the real hub does for burst, minimal and observable."""

    def __init__(self, nats_url: str, *, every_s: float = 0.3, answer_state: bool = True) -> None:
        self.bus = Bus(BusSettings(url=nats_url, name="test-hub"))
        self.every_s = every_s
        self.answer_state = answer_state
        self.events: list[InstanceEvent] = []
        self.latest: dict[str, InstanceEvent] = {}
        self.reports: dict[str, list[CapacityReport]] = {}
        self.state_requests = 0
        self._items: list[tuple[dict[str, Any], float]] = []
        self._seq = 0
        self._subs: list[Any] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> HubRole:
        await self.bus.connect()
        await self.bus.ensure_streams()  # the spokes wait for the command stream
        try:
            await self.bus.js.stream_info(BURST_STREAM)
        except NotFoundError:  # a bus that does not create it with the others
            await self.bus.js.add_stream(
                StreamConfig(
                    name=BURST_STREAM,
                    subjects=[BURST_INSTANCES],
                    duplicate_window=DUPLICATE_WINDOW_S,
                )
            )
        nc = self.bus.nc
        self._subs = [
            await self.bus.js.subscribe(
                BURST_INSTANCES, ordered_consumer=True, cb=self._on_instance
            ),
            await nc.subscribe(BURST_STATE, cb=self._on_state),
            await nc.subscribe(subjects.CAPACITY_SUBJECTS, cb=self._on_capacity),
        ]
        self._task = asyncio.create_task(self._publish_loop())
        return self

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        await self.bus.close()

    # --- demand ---

    def demand(self, **item: Any) -> None:
        """Add pending demand (DemandItem fields); its age counts from now."""
        self._items.append((item, time.time()))

    def clear_demand(self) -> None:
        """Everything got placed: the next reports are empty."""
        self._items.clear()

    async def _publish_loop(self) -> None:
        while True:
            now = time.time()
            self._seq += 1
            report = DemandReport(
                items=tuple(
                    DemandItem(oldest_age_s=now - since, **fields) for fields, since in self._items
                ),
                sent_at=now,
                seq=self._seq,
            )
            await self.bus.publish(BURST_DEMAND, report.model_dump_json().encode())
            await asyncio.sleep(self.every_s)

    # --- what the controller and the spokes said ---

    def burst_ids(self) -> list[str]:
        """Instances in order of their first event."""
        return list(dict.fromkeys(event.burst_id for event in self.events))

    def states(self, burst_id: str) -> list[InstanceState]:
        """The states an instance went through, repeats collapsed."""
        found: list[InstanceState] = []
        for event in self.events:
            if event.burst_id == burst_id and (not found or found[-1] is not event.state):
                found.append(event.state)
        return found

    def first(self, burst_id: str, state: InstanceState) -> InstanceEvent:
        return next(e for e in self.events if e.burst_id == burst_id and e.state is state)

    async def _on_instance(self, msg: Msg) -> None:
        event = InstanceEvent.model_validate_json(msg.data)
        self.events.append(event)
        self.latest[event.burst_id] = event

    async def _on_state(self, msg: Msg) -> None:
        self.state_requests += 1
        if not self.answer_state:
            return  # like a hub that is not up yet: the request times out
        reply = BurstStateReply(
            instances=tuple(sorted(self.latest.values(), key=lambda e: (e.at, e.burst_id)))
        )
        await msg.respond(reply.model_dump_json().encode())

    async def _on_capacity(self, msg: Msg) -> None:
        report = CapacityReport.model_validate_json(msg.data)
        self.reports.setdefault(report.spoke_id, []).append(report)


def pid_of(event: InstanceEvent) -> int:
    """The local provider's process id from an event's provider_instance_id (`pid-<n>`)."""
    assert event.provider_instance_id.startswith("pid-"), event.provider_instance_id
    return int(event.provider_instance_id.removeprefix("pid-"))


def process_gone(pid: int, burst_id: str) -> bool:
    """No live process with this pid runs the spoke of `burst_id` (a zombie counts as gone)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return burst_id.encode() not in cmdline
