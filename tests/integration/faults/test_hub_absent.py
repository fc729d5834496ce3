"""A spoke whose hub is gone: NATS answers its capacity reports with "no responders" (a 503
status message on the report's reply subject). That is no lease ack: the spoke says once that
the hub is not reachable, logs no malformed ack, and fences its movable work after fence_after."""

from __future__ import annotations

import time

import structlog

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


async def test_a_spoke_without_its_hub_fences_and_takes_no_reply_for_an_ack(
    fed: InProcessFederation,
) -> None:
    # fence_after = lost_after 4 s - stop grace 2 s - 3 heartbeats of 0.2 s = 1.4 s
    await fed.start_hub(suspect_after_s=2.0, lost_after_s=4.0)
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"), heartbeat_s=0.2)
    await fed.wait_spokes(1)
    movable = await fed.submit(
        name="movable", team="drill", command=["sleep", "300"], restart_policy="on_failure"
    )
    kept = await fed.submit(
        name="kept",
        team="drill",
        command=["sleep", "300"],
        restart_policy="on_failure",
        on_hub_loss="keep",
    )
    for wid in (movable, kept):
        await fed.wait_phase(wid, {Phase.RUNNING})
    assert spoke.fence.fence_after_s is not None

    with structlog.testing.capture_logs() as logs:
        await fed.stop("hub")
        # Fenced after 1.4 s of silence: several heartbeats met no hub meanwhile.
        await wait_until(
            lambda: movable not in spoke.runtime.running(), timeout=30, what="the fence"
        )

    events = [e["event"] for e in logs]
    assert "malformed_lease_ack" not in events
    assert events.count("hub_not_reachable") == 1
    assert "fencing_workload" in events
    assert kept in spoke.runtime.running()  # on_hub_loss=keep runs on


#: How long the hub is away in the test below, by its clock.
AWAY_S = 3600.0


async def test_a_run_that_ended_while_the_hub_was_away_counts_its_own_time(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"), heartbeat_s=0.2)
    await fed.wait_spokes(1)
    release = fed.root / "release"
    wid = await fed.submit(
        name="short",
        team="drill",
        on_hub_loss="keep",
        command=["sh", "-c", f'until [ -e "{release}" ]; do sleep 0.05; done'],
    )
    await fed.wait_phase(wid, {Phase.RUNNING})

    await fed.stop("hub")
    release.touch()  # it ends on its spoke, which journals the end for the hub
    await wait_until(lambda: wid not in spoke.runtime.running(), timeout=30, what="its end")
    await fed.start_hub(clock=lambda: time.time() + AWAY_S)  # back an hour later
    record = await fed.wait_phase(wid, {Phase.SUCCEEDED})

    # The run's own seconds (GPU-hours, fair share), not the hub's hour away.
    assert record["run_s"] < AWAY_S / 2
    assert record["history"][-1]["at"] < time.time()
