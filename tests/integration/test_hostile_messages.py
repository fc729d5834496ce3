"""Deeply nested or huge payloads on every NATS subject: counted as malformed, never a crash."""

from __future__ import annotations

import pytest

from bus.client import Bus
from schemas import CapacityReport, Phase, subjects
from schemas.burst import BURST_STATE, BURST_VERDICTS
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.security]

NESTED = b'{"spoke_id": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
HUGE = b'{"spoke_id": "eu-1", "incarnation": "' + b"x" * 900_000 + b'"}'
NUL = b'{"spoke_id": "eu-1\\u0000", "incarnation": "i", "seq": 0, "sent_at": 0, "region": "eu"}'


async def test_hostile_payloads_on_every_subject_are_survived(fed: InProcessFederation) -> None:
    hub = await fed.start_hub()
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    bus = Bus(fed.tool_settings())
    await bus.connect()
    before = hub.counters["malformed"]
    for payload in (NESTED, HUGE, NUL):
        await bus.publish(subjects.capacity("eu-1"), payload)
        await bus.publish(BURST_VERDICTS, payload)
        await bus.publish_durable(subjects.events("eu-1"), payload, f"bad-{len(payload)}")
        for subject in (subjects.sync("eu-1"), subjects.SUBMIT, BURST_STATE):
            await bus.nc.request(subject, payload, timeout=5)  # answered, not crashed
        await bus.publish_durable(subjects.commands("eu-1"), payload, f"badcmd-{len(payload)}")
    await wait_until(
        lambda: hub.counters["malformed"] - before >= 12, 20, "12 malformed at the hub"
    )
    await wait_until(lambda: spoke.counters["malformed"] >= 3, 20, "3 malformed commands")
    # Both still work.
    wid = await fed.submit(name="after", team="t", command=["true"])
    assert (await fed.wait_phase(wid, {Phase.SUCCEEDED}))["phase"] == "succeeded"
    await bus.close()


async def test_a_spoke_burst_did_not_launch_cannot_reserve_itself_for_a_team(
    fed: InProcessFederation,
) -> None:
    hub = await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()
    before = hub.counters["malformed"]
    claim = CapacityReport(
        spoke_id="eu-9",
        region="eu",
        incarnation="i",
        seq=1,
        sent_at=0.0,
        labels={"burst-team": "vision"},
    )
    await bus.publish(subjects.capacity("eu-9"), claim.model_dump_json().encode())
    await wait_until(lambda: hub.counters["malformed"] == before + 1, 5, "the report dropped")
    assert "eu-9" not in hub.reports
    await bus.close()
