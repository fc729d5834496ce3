"""The whole chain: hub and NATS, and a spoke configured like `gpufed spoke --inventory slurm
--runtime slurm` on a login node of the test cluster; a two-node gang runs as one Slurm job."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.natsserver import EmbeddedNats
from schemas import Phase
from tests.integration.fed import InProcessFederation
from tests.slurm.cluster import SlurmCluster


async def test_placed_work_runs_as_a_slurm_job_and_its_end_reaches_the_hub(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As on a login node: the Slurm commands find the cluster through SLURM_CONF.
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))
    with EmbeddedNats(tmp_path / "nats") as nats:
        fed = InProcessFederation(nats.url, tmp_path)
        await fed.start_hub()
        try:
            agent = await fed.start_spoke(
                "hpc-eu", "eu", None, inventory="slurm", runtime="slurm", slurm_partition="gpu",
                ready_s=20,
            )  # fmt: skip
            await fed.wait_spokes(1)
            spokes = (await fed.api.get("/v1/spokes")).json()  # type: ignore[union-attr]
            assert spokes[0]["gpus"]["H100"]["total"] == 16  # n1 and n2, 8 each
            wid = await fed.submit(
                name="train", team="vision", gpus_per_node=4, nodes=2, gpu_model="H100",
                command=["sh", "-c", 'echo "rank $GPUFED_NODE_RANK on $GPUFED_NODE"'],
            )  # fmt: skip

            record = await fed.wait_phase(wid, {Phase.SUCCEEDED, Phase.FAILED}, timeout=60)

            assert record["phase"] == "succeeded" and record["spoke_id"] == "hpc-eu"
            (log,) = (agent.settings.workdir / "logs").glob(f"{wid}-e*.log")
            assert sorted(log.read_text().splitlines()) == ["rank 0 on n1", "rank 1 on n2"]
        finally:
            await fed.close()
