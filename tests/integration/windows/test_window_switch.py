"""The hub switches policy at a window boundary by itself and reclaims under the new guarantees."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from hub.policyfile import load_policy, policy_to_dict
from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes

# Nights: nlp's guarantee covers the whole node. Weekdays from 08:00 Berlin time vision gets
# half of it back.
POLICY = """
teams:
  - name: nlp
    quotas: {H100: {guaranteed: 8}}
  - name: vision
    quotas: {H100: {guaranteed: 0}}
windows:
  - name: workday
    timezone: Europe/Berlin
    days: weekdays
    start: "08:00"
    end: "20:00"
    teams:
      nlp: {quotas: {H100: {guaranteed: 4}}}
      vision: {quotas: {H100: {guaranteed: 4}}}
"""
BERLIN = ZoneInfo("Europe/Berlin")
BOUNDARY = datetime(2026, 11, 30, 8, 0, tzinfo=BERLIN).timestamp()  # a Monday


class ShiftedClock:
    """Real time, shifted: the hub's waits are real, its idea of the hour is the test's."""

    def __init__(self, at: float) -> None:
        self.offset = 0.0
        self.set(at)

    def set(self, at: float) -> None:
        self.offset = at - time.time()

    def __call__(self) -> float:
        return time.time() + self.offset


def job(name: str, team: str) -> dict[str, Any]:
    return {
        "name": name,
        "team": team,
        "priority_class": "batch",
        "gpus_per_node": 1,
        "gpu_model": "H100",
        "command": ["sleep", "120"],
    }


async def test_boundary_triggers_a_cycle_that_reclaims_under_the_window(
    fed: InProcessFederation,
) -> None:
    clock = ShiftedClock(BOUNDARY - 2 * 3600)  # Monday 06:00: night policy
    # A tick of an hour: only the window boundary itself can wake the cycle in time.
    await fed.start_hub(clock=clock, tick_s=3600.0)
    assert fed.api is not None
    document = policy_to_dict(load_policy(POLICY))
    assert (await fed.api.put("/v1/policy", json=document)).status_code == 200
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"))
    await fed.wait_spokes(1)
    night = [await fed.submit(**job(f"nlp-{i}", "nlp")) for i in range(8)]
    for wid in night:
        await fed.wait_phase(wid, {Phase.RUNNING})

    clock.set(BOUNDARY - 4)  # four seconds before 08:00
    day = [await fed.submit(**job(f"vision-{i}", "vision")) for i in range(4)]
    for wid in day:
        record = await fed.wait_phase(wid, {Phase.RUNNING}, timeout=30)
        placed = [h["at"] for h in record["history"] if h["event"] == "placed"]
        assert placed and placed[0] >= BOUNDARY  # not a moment before the window opened

    requeued = [r for r in [await fed.workload(w) for w in night] if r["phase"] == "queued"]
    assert len(requeued) == 4  # nlp keeps its daytime guarantee of 4
    for r in requeued:
        details = [h["detail"] for h in r["history"] if h["event"] == "preempting"]
        assert details and "under policy window workday" in details[0]

    shown = (await fed.api.get("/v1/policy")).json()
    assert shown["windows"][0]["name"] == "workday"  # the policy as written keeps its windows
