"""Full-state reconciliation: stale work is stopped, lost placements requeued, and twice is once."""

from __future__ import annotations

import asyncio

from schemas import Phase, RunningRef, SyncRequest
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


async def test_reconcile_stops_superseded_work_requeues_lost_work_and_is_idempotent(
    fed: InProcessFederation,
) -> None:
    hub = await fed.start_hub(missing_grace_s=0.0)
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(name="long", team="vision", command=["sleep", "30"])
    record = await fed.wait_phase(wid, {Phase.RUNNING})
    epoch = record["epoch"]
    await wait_until(lambda: spoke.journal.state.applied_seq > 0)

    # The spoke says it runs an assignment the hub has superseded, and no longer runs ours.
    request = SyncRequest(
        spoke_id="eu-1",
        incarnation="test",
        running=(RunningRef(workload_id="w-moved-away", epoch=3),),
        applied_seq=spoke.journal.state.applied_seq,
    )
    first = await hub.reconcile(request)
    assert [r.workload_id for r in first.stop] == ["w-moved-away"]
    assert first.requeued == (wid,)
    second = await hub.reconcile(request)
    assert [r.workload_id for r in second.stop] == ["w-moved-away"]
    assert second.requeued == ()  # already requeued: nothing more changes

    # Requeued under a new epoch: the old run is fenced off and the workload runs again.
    await wait_until(lambda: hub.workloads[wid].epoch > epoch)
    rerun = await fed.wait_phase(wid, {Phase.RUNNING})
    assert rerun["epoch"] > epoch
    assert any(h["event"] == "lost_on_spoke" for h in rerun["history"])


async def test_a_spoke_that_syncs_its_true_state_changes_nothing(fed: InProcessFederation) -> None:
    hub = await fed.start_hub(missing_grace_s=0.0)
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 4, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(name="long", team="vision", command=["sleep", "30"])
    await fed.wait_phase(wid, {Phase.RUNNING})
    for _ in range(2):
        reply = await spoke.sync()
        assert reply.stop == () and reply.requeued == ()
    await asyncio.sleep(0.2)
    assert hub.workloads[wid].phase == Phase.RUNNING
