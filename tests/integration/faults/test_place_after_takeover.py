"""A Place an earlier leader published, and a spoke that heard the new leader first dropped
(an older term's command), is sent again by the new leader: the workload runs.

Before, the new leader loaded the workload placed, most often with no stream sequence for its
Place (the old leader keeps it in memory until the workload's next change, and died first),
so reconciliation could never tell the spoke had dropped it from it being on its way: the
workload waited placed for ever (`bench/chaos.py --minutes 3 --seed 1` ended with 1 to 3
such workloads `stuck` after a `kill_leader`).
"""

from __future__ import annotations

import json

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


async def test_a_place_a_spoke_dropped_for_its_old_term_is_sent_again(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"), heartbeat_s=0.2)
    await wait_until(lambda: spoke.fence.heard_at is not None, 10, "the spoke to hear the hub")
    await fed.stop("eu-1")  # its commands wait in the stream
    wid = await fed.submit(name="train", team="vision", command=["sleep", "300"])
    await fed.wait_phase(wid, {Phase.PLACED})  # published under term 1
    await fed.stop("hub")
    await fed.start_hub()  # term 2
    assert fed.hub is not None and fed.hub.state.term == 2
    # The spoke heard the new leader before it read the Place (its lease ack came first).
    fence = fed.root / "spokes" / "eu-1" / "fence.json"
    state = json.loads(fence.read_text())
    fence.write_text(json.dumps({**state, "term": 2}))
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    record = await fed.wait_phase(wid, {Phase.RUNNING}, timeout=30)
    assert (record["spoke_id"], record["epoch"]) == ("eu-1", 1)
