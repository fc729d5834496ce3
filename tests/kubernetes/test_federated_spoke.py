"""The whole chain: hub and NATS, and a spoke configured like `gpufed spoke --inventory
kubernetes --runtime kubernetes --kubeconfig FILE` against the Kubernetes API emulator."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from bus.natsserver import EmbeddedNats
from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.kubernetes.conftest import Cluster
from tests.kubernetes.test_kube_client import write_kubeconfig
from tests.kubernetes.test_runtime_events import running_status, terminated_status
from tests.support.wait import wait_until


async def test_placed_work_runs_as_a_job_and_its_end_reaches_the_hub(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.add_node("gpu-a", gpus=8, product="NVIDIA-H100-80GB-HBM3")
    cluster.add_node("gpu-b", gpus=8, product="NVIDIA-H100-80GB-HBM3", unschedulable=True)
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", {"emu": cluster.url}, "emu")
    with EmbeddedNats(tmp_path / "nats") as nats:
        fed = InProcessFederation(nats.url, tmp_path)
        await fed.start_hub()
        try:
            await fed.start_spoke(
                "k8s-eu", "eu", None, inventory="kubernetes", runtime="kubernetes",
                kubeconfig=str(kubeconfig),
            )  # fmt: skip
            await fed.wait_spokes(1)
            spokes = (await fed.api.get("/v1/spokes")).json()  # type: ignore[union-attr]
            assert spokes[0]["gpus"]["H100"] == {"total": 16, "free": 8}  # gpu-b is cordoned
            wid = await fed.submit(
                name="train", team="vision", gpus_per_node=4, gpu_model="H100",
                image="pytorch/pytorch:2.4.0", command=["python", "train.py"],
            )  # fmt: skip
            await cluster.eventually(lambda: len(cluster.jobs()) == 1, 10)
            job = cluster.jobs()[0]
            container = job["spec"]["template"]["spec"]["containers"][0]
            assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
            assert container["image"] == "pytorch/pytorch:2.4.0"
            assert job["metadata"]["namespace"] == "gpufed-vision"
            assert job["metadata"]["labels"]["gpufed.io/workload-id"] == wid
            pod = f"{job['metadata']['name']}-0"
            await cluster.add_job_pod(job, pod, "gpu-a")
            await cluster.set_pod_status("gpufed-vision", pod, running_status())
            await fed.wait_phase(wid, {Phase.RUNNING})
            await cluster.set_pod_status("gpufed-vision", pod, terminated_status(0, "Completed"))
            await cluster.set_job_status(
                "gpufed-vision",
                job["metadata"]["name"],
                {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]},
            )
            record = await fed.wait_phase(wid, {Phase.SUCCEEDED, Phase.FAILED})
            assert record["phase"] == "succeeded" and record["spoke_id"] == "k8s-eu"
        finally:
            await fed.close()


#: The hub's lease in the test below: the Kubernetes API is away for longer than this.
LOST_AFTER_S = 4.0


async def test_work_runs_on_while_the_api_server_is_away_past_the_lease(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.add_node("gpu-a", gpus=8, product="NVIDIA-H100-80GB-HBM3")
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", {"emu": cluster.url}, "emu")
    with EmbeddedNats(tmp_path / "nats") as nats:
        fed = InProcessFederation(nats.url, tmp_path)
        await fed.start_hub(suspect_after_s=2.0, lost_after_s=LOST_AFTER_S)
        try:
            await fed.start_spoke(
                "k8s-eu", "eu", None, inventory="kubernetes", runtime="kubernetes",
                kubeconfig=str(kubeconfig), heartbeat_s=0.2,
            )  # fmt: skip
            # A second spoke, so that the hub, hearing one, may declare the other lost.
            await fed.start_spoke("eu-2", "eu", nodes("eu-2", 1, 8, "A100"), heartbeat_s=0.2)
            await fed.wait_spokes(2)
            wid = await fed.submit(
                name="train", team="vision", gpus_per_node=4, gpu_model="H100",
                restart_policy="on_failure", command=["python", "train.py"],
            )  # fmt: skip
            await cluster.eventually(lambda: len(cluster.jobs()) == 1, 10)
            job = cluster.jobs()[0]
            pod = f"{job['metadata']['name']}-0"
            await cluster.add_job_pod(job, pod, "gpu-a")
            await cluster.set_pod_status("gpufed-vision", pod, running_status())
            await fed.wait_phase(wid, {Phase.RUNNING})

            away_since = time.time()
            cluster.emulator["list v1/nodes"] << 503 << {"kind": "Status", "code": 503}
            assert fed.hub is not None
            hub = fed.hub
            # The spoke goes on reporting (nodes unschedulable) past the hub's lease.
            await wait_until(
                lambda: hub.reports["k8s-eu"].sent_at > away_since + LOST_AFTER_S + 1,
                timeout=30,
                what="a report from the spoke past the lease",
            )
            # The whole process stalls for longer than fence_after (1.4 s here: a collector's
            # pause, a paused VM). The silence was the spoke's own, and the hub answers it
            # again at once: its work runs on.
            time.sleep(1.6)  # noqa: ASYNC251 (the stall under test)
            await asyncio.sleep(1.0)
            jobs = len(cluster.jobs())  # counted before the federation stops
            record = await fed.workload(wid)
            spokes = {s["id"]: s for s in (await fed.api.get("/v1/spokes")).json()}  # type: ignore[union-attr]
        finally:
            await fed.close()

    assert (record["phase"], record["spoke_id"], record["epoch"]) == ("running", "k8s-eu", 1)
    assert spokes["k8s-eu"]["status"] == "ready"
    assert spokes["k8s-eu"]["gpus"]["H100"]["free"] == 0  # nothing new goes there meanwhile
    assert jobs == 1  # not fenced: its Job is still there
