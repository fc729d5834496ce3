"""The Slurm inventory against the real controller: GPUs from GRES, state, features, others' use."""

from __future__ import annotations

from schemas import EventPhase
from spoke.inventory.slurm import SlurmInventory
from spoke.runtime.slurm import SlurmRuntime
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import EventLog, launch
from tests.support.wait import wait_until


async def test_nodes_gpus_features_and_state_come_from_slurm(slurm_cluster: SlurmCluster) -> None:
    nodes = {n.name: n for n in await SlurmInventory(slurm_cluster.cli(), "inv").nodes()}

    assert sorted(nodes) == ["n1", "n2"]
    n1 = nodes["n1"]
    assert (n1.gpu_model, n1.gpu_count, n1.schedulable, n1.busy_outside) == ("H100", 8, True, 0)
    assert n1.labels == {
        "slurm/state": "idle",
        "slurm.partition/gpu": "true",
        "slurm.feature/ib": "true",
        "slurm.feature/nvlink": "true",
    }
    assert "slurm.feature/nvlink" not in nodes["n2"].labels


async def test_a_partition_limits_the_nodes(slurm_cluster: SlurmCluster) -> None:
    assert len(await SlurmInventory(slurm_cluster.cli(), "inv", partition="gpu").nodes()) == 2
    assert await SlurmInventory(slurm_cluster.cli(), "inv", partition="other").nodes() == []


async def test_gpus_of_jobs_gpufed_did_not_submit_count_as_busy(
    slurm_cluster: SlurmCluster, runtime: SlurmRuntime, events: EventLog
) -> None:
    spoke_id = runtime.spoke_id  # the runtime fixture's spoke: its own jobs are not "outside"
    inventory = SlurmInventory(slurm_cluster.cli(), spoke_id)
    foreign = slurm_cluster.run(
        "sbatch", "--parsable", "-w", "n1", "--gres=gpu:h100:3", "--wrap", "sleep 60"
    ).strip()
    try:
        await runtime.start(launch("ours", ["sleep", "60"], nodes=("n1",), gpus=2))
        await events.wait_for("ours", EventPhase.RUNNING)
        await wait_until(
            lambda: "RUNNING" in slurm_cluster.run("squeue", "-h", "-o", "%T", "-j", foreign),
            30,
            "the other user's job running",
            every=0.2,
        )

        nodes = {n.name: n for n in await inventory.nodes()}

        assert nodes["n1"].busy_outside == 3  # the other user's 3, not our 2
        assert nodes["n1"].labels["slurm/state"] == "mixed"
        assert nodes["n2"].busy_outside == 0
        # Another spoke sees our job as someone else's too.
        other = {n.name: n for n in await SlurmInventory(slurm_cluster.cli(), "x").nodes()}
        assert other["n1"].busy_outside == 5
    finally:
        slurm_cluster.run("scancel", foreign)


async def test_a_drained_node_is_not_schedulable(slurm_cluster: SlurmCluster) -> None:
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=bad gpu")
    try:
        nodes = {n.name: n for n in await SlurmInventory(slurm_cluster.cli(), "inv").nodes()}
        assert nodes["n2"].schedulable is False
        assert nodes["n2"].labels["slurm/state"] == "idle+drain"
        assert nodes["n1"].schedulable is True
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume")
    # Back in service once slurmd answers the controller's ping.
    await wait_until(lambda: all_schedulable(slurm_cluster), 30, "n2 back in service", every=0.2)
    nodes = {n.name: n for n in await SlurmInventory(slurm_cluster.cli(), "inv").nodes()}
    assert nodes["n2"].labels["slurm/state"] == "idle"


async def all_schedulable(cluster: SlurmCluster) -> bool:
    return all(n.schedulable for n in await SlurmInventory(cluster.cli(), "inv").nodes())
