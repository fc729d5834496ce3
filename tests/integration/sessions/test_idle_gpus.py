"""Allocated GPUs left idle are flagged in the API, `gpufed jobs` and `explain`, and reclaimed
where the policy says so (its classes and sessions; never production)."""

from __future__ import annotations

from typing import Any

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.integration.sessions.helpers import STOP_ON_EXIT, gpufed
from tests.integration.sessions.test_culling import set_policy
from tests.support.wait import wait_until

POLICY = "idle: {util_percent: 5, flag_after: 1s, reclaim_after: 4s, classes: [dev]}"


def job(name: str, cls: str, load: float | None) -> dict[str, Any]:
    # A workload says how busy its (simulated) GPUs are in $GPUFED_LOAD_FILE; none: fully busy.
    report = f'echo {load:g} > "$GPUFED_LOAD_FILE"; ' if load is not None else ""
    return {
        "name": name,
        "team": "vision",
        "priority_class": cls,
        "command": ["sh", "-c", f"{report}sleep 120"],
    }


async def test_idle_gpus_are_flagged_then_reclaimed_for_dev_only(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await set_policy(fed, POLICY)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"), **STOP_ON_EXIT)
    await fed.wait_spokes(1)
    idle_dev = await fed.submit(**job("idle-dev", "dev", 2))
    idle_train = await fed.submit(**job("idle-train", "training", 0))
    busy_dev = await fed.submit(**job("busy-dev", "dev", None))
    for wid in (idle_dev, idle_train, busy_dev):
        await fed.wait_phase(wid, {Phase.RUNNING})

    async def flagged() -> bool:
        return (await fed.workload(idle_train))["idle_s"] is not None

    await wait_until(flagged, 20, "the idle training job to be flagged", every=0.1)
    async with fed.serve() as api:
        code, out, err = await gpufed(fed, api, "jobs")
        assert code == 0, err
        rows = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert "GPUs idle" in rows[idle_train]
        assert "GPUs idle" not in rows[busy_dev]
        code, out, err = await gpufed(fed, api, "explain", idle_train)
        assert code == 0, err
        assert "idle:   GPUs idle for" in out

    reclaimed = await fed.wait_phase(idle_dev, {Phase.CANCELLED}, timeout=30)
    assert reclaimed["reason"] == "idle_reclaimed"
    notices = [h["detail"] for h in reclaimed["history"] if h["event"] == "stopping"]
    assert notices and "policy idle.reclaim_after 4s" in notices[0]
    # Idle as long, but not of a class the policy reclaims; busy, so never idle at all.
    training = await fed.workload(idle_train)
    assert training["phase"] == "running" and training["idle_s"] >= 4
    busy = await fed.workload(busy_dev)
    assert busy["phase"] == "running" and busy["idle_s"] is None
