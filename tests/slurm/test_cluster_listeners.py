"""The test cluster keeps to loopback: no daemon, and no `srun` of a job, listens on any other
address (every service a test starts binds 127.0.0.1)."""

from __future__ import annotations

from schemas import EventPhase
from spoke.runtime.slurm import SlurmRuntime
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import EventLog, launch
from tests.support.wait import wait_until


async def test_daemons_and_job_steps_listen_on_loopback_only(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    # A two-node gang: its srun listens for its tasks' I/O while the steps run.
    await runtime.start(launch("listen", ["sleep", "30"], nodes=("n1", "n2"), gpus=1))
    await events.wait_for("listen", EventPhase.RUNNING)
    # RUNNING is the batch step; its srun starts (and listens) a moment later.
    await wait_until(lambda: "srun" in slurm_cluster.listeners(), 20, "the gang's srun", every=0.2)

    listening = slurm_cluster.listeners()

    assert {"slurmctld", "slurmd", "srun"} <= set(listening), listening
    outside = {
        program: {a for a in addresses if not a.startswith("127.0.0.1:")}
        for program, addresses in listening.items()
    }
    assert not any(outside.values()), outside
