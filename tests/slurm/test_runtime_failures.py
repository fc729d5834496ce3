"""What Slurm does to a job behind gpufed's back: a node fails, an admin cancels it."""

from __future__ import annotations

from schemas import EventPhase
from spoke.runtime.slurm import SlurmRuntime
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import EventLog, launch
from tests.slurm.test_inventory import all_schedulable
from tests.support.wait import wait_until


async def test_a_node_going_down_fails_the_job_with_node_fail(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    await runtime.start(launch("on-n2", ["sleep", "60"], nodes=("n2",)))
    await events.wait_for("on-n2", EventPhase.RUNNING)
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=down", "reason=test")
    try:
        end = await events.wait_end("on-n2")
        assert (end.phase, end.reason) == (EventPhase.FAILED, "node_fail")
    finally:
        # With ReturnToService=2 the node may be back already; then "resume" is refused.
        slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume", check=False)
        # Back in service once slurmd answers the controller.
        await wait_until(
            lambda: all_schedulable(slurm_cluster), 30, "n2 back in service", every=0.2
        )


async def test_a_job_cancelled_outside_gpufed_is_reported_failed(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    await runtime.start(launch("admin-cancel", ["sleep", "60"]))
    await events.wait_for("admin-cancel", EventPhase.RUNNING)
    job_id = runtime.job_id("admin-cancel")
    assert job_id is not None

    slurm_cluster.run("scancel", job_id)

    end = await events.wait_end("admin-cancel")
    assert (end.phase, end.reason) == (EventPhase.FAILED, "cancelled_outside_gpufed")
    assert f"Slurm job {job_id}" in end.message
