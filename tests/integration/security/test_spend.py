"""Burst spend is accrued in the store, survives a hub restart, and reaches burst as a budget."""

from __future__ import annotations

import time

from bus.client import Bus
from bus.natsserver import EmbeddedNats
from schemas.burst import (
    BURST_DEMAND,
    BURST_INSTANCES,
    DemandReport,
    InstanceEvent,
    InstanceState,
    Market,
)
from tests.integration.fed import InProcessFederation
from tests.support.wait import wait_until


def launched(at: float) -> bytes:
    return (
        InstanceEvent(
            burst_id="burst-t-1",
            provider="local",
            instance_type="p5.48xlarge",
            region="us-east-1",
            market=Market.SPOT,
            price_per_hour=36.0,
            team="vision",
            state=InstanceState.REQUESTED,
            at=at,
        )
        .model_dump_json()
        .encode()
    )


async def spend(fed: InProcessFederation) -> float:
    assert fed.api is not None
    teams = (await fed.api.get("/v1/usage")).json()["rows"]
    return float(teams.get("vision", {}).get("burst_spend_month", 0.0))


async def test_spend_survives_a_restart_and_caps_the_team(
    fed: InProcessFederation, nats_server: EmbeddedNats
) -> None:
    await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()
    demands: list[DemandReport] = []

    async def on_demand(msg: object) -> None:
        demands.append(DemandReport.model_validate_json(msg.data))  # type: ignore[attr-defined]

    sub = await bus.nc.subscribe(BURST_DEMAND, cb=on_demand)
    try:
        # An instance launched a minute ago at $36/h: $0.60 so far.
        start = time.time() - 60
        await bus.publish_durable(BURST_INSTANCES, launched(start), "launch-1")
        await wait_until(
            lambda: fed.hub is not None and "burst-t-1" in fed.hub.instances, 10, "the launch"
        )

        async def accrued(at_least: float) -> bool:
            return await spend(fed) >= at_least

        await wait_until(lambda: accrued(36.0 * 59 / 3600), 10, "a minute of spend accrued")
        before = await spend(fed)

        await fed.stop("hub")
        await fed.start_hub()
        await wait_until(lambda: accrued(before), 10, "the new hub to read the spend back")
        after = await spend(fed)
        # Kept, and not billed twice: only the seconds since the restart are added.
        assert before <= after < before + 36.0 * 30 / 3600

        assert fed.api is not None
        policy = {
            "teams": [
                {"name": "vision", "may_burst": True, "burst_budget": {"dollars_per_month": 0.5}}
            ],
            "burst": {"dollars_per_hour": 99},
        }
        assert (await fed.api.put("/v1/policy", json=policy)).status_code == 200

        def capped() -> bool:
            budget = demands[-1].budget if demands else None
            return (
                budget is not None
                and budget.dollars_per_hour == 99
                and budget.allowed_teams == ("vision",)
                and budget.teams["vision"].dollars_left_this_month == 0.0
            )

        await wait_until(capped, 10, "the budget in the demand")
        entries = (await fed.api.get("/v1/audit", params={"action": "burst.launch"})).json()
        assert [(e["actor"], e["team"], e["target"]) for e in entries] == [
            ("burst", "vision", "burst-t-1")
        ]
    finally:
        await sub.unsubscribe()
        await bus.close()


async def test_a_team_admin_sees_only_their_teams_usage_over_time(
    fed: InProcessFederation,
) -> None:
    """`/v1/usage/series` (the console's charts) is scoped like `/v1/usage`: a team-admin of
    vision never sees what nlp's instances cost."""
    await fed.start_hub()
    bus = Bus(fed.tool_settings())
    await bus.connect()
    try:
        start = time.time() - 60
        for team in ("vision", "nlp"):
            event = InstanceEvent.model_validate_json(launched(start))
            event = event.model_copy(update={"burst_id": f"burst-{team}-1", "team": team})
            await bus.publish_durable(
                BURST_INSTANCES, event.model_dump_json().encode(), f"launch-{team}"
            )
        await wait_until(lambda: fed.hub is not None and len(fed.hub.bills) == 2, 10, "both bills")
        since = {"since": start - 60}
        assert fed.api is not None
        everything = (await fed.api.get("/v1/usage/series", params=since)).json()
        assert set(everything["cost"]) == {"vision", "nlp"}
        tess = fed.client(await fed.token("tess", "team-admin", "vision"))
        try:
            answer = await tess.get("/v1/usage/series", params=since)
        finally:
            await tess.aclose()
        assert answer.status_code == 200
        assert set(answer.json()["cost"]) == {"vision"}
    finally:
        await bus.close()
