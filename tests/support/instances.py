"""Burst instance events as the burst controller publishes them (a cloud spoke rented, gone)."""

from __future__ import annotations

from typing import Any

from bus.client import Bus
from schemas.burst import BURST_INSTANCES, InstanceEvent, InstanceState, Market


async def publish_instance(
    bus: Bus, burst_id: str, state: InstanceState, at: float, **fields: Any
) -> InstanceEvent:
    """Publish one state of instance `burst_id` (an L4 x2 on demand for vision, at a dollar a
    second, unless `fields` say otherwise) as burst does: durably, once per state."""
    base: dict[str, Any] = {
        "burst_id": burst_id,
        "provider": "local",
        "instance_type": "sim.l4x2",
        "region": "us-east-1",
        "market": Market.ON_DEMAND,
        "gpu_model": "L4",
        "gpu_count": 2,
        "price_per_hour": 3600.0,  # a dollar a second: visible in a short test
        "team": "vision",
    }
    event = InstanceEvent(**{**base, **fields}, state=state, at=at)
    await bus.publish_durable(
        BURST_INSTANCES, event.model_dump_json().encode(), f"{burst_id}-{state.value}"
    )
    return event
