"""A spoke whose hub is gone: NATS answers its capacity reports with "no responders" (a 503
status message on the report's reply subject). That is no lease ack: the spoke says once that
the hub is not reachable, logs no malformed ack, and fences its movable work after fence_after."""

from __future__ import annotations

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
