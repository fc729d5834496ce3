"""End to end over a real nats-server: hub, three spokes, real processes."""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from pathlib import Path

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

# Each workload appends "<start|end> <time_ns> <node> <devices> <id>" to a shared file: the
# spoke-side truth of which devices a process really saw and when.
RECORD = (
    'echo "start $(date +%s%N) $GPUFED_NODE $CUDA_VISIBLE_DEVICES $GPUFED_WORKLOAD_ID" >> {log}; '
    "sleep {secs}; "
    'echo "end $(date +%s%N) $GPUFED_NODE $CUDA_VISIBLE_DEVICES $GPUFED_WORKLOAD_ID" >> {log}'
)


async def test_fifty_workloads_run_on_the_gpus_they_asked_for(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 2, 4, "H100"))
    await fed.start_spoke("eu-2", "eu", nodes("eu-2", 1, 4, "A100"))
    await fed.start_spoke("us-1", "us", nodes("us-1", 2, 2, "L4"))
    await fed.wait_spokes(3)
    log = tmp_path / "runs.log"
    rng = random.Random(7)
    asked: dict[str, int] = {}
    for i in range(50):
        gpus = rng.choice([1, 1, 2, 2, 4])
        wid = await fed.submit(
            name=f"job-{i}",
            team=rng.choice(["vision", "nlp"]),
            gpus_per_node=gpus,
            command=["sh", "-c", RECORD.format(log=log, secs=rng.choice([0.1, 0.2, 0.3]))],
        )
        asked[wid] = gpus

    for wid in asked:
        record = await fed.wait_phase(wid, {Phase.SUCCEEDED, Phase.FAILED}, timeout=60)
        assert record["phase"] == "succeeded", record

    starts: dict[str, tuple[int, str, list[str]]] = {}
    intervals: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for line in log.read_text().splitlines():
        what, t, node, devices, wid = line.split()
        if what == "start":
            assert wid not in starts, f"{wid} started twice"
            starts[wid] = (int(t), node, devices.split(","))
        else:
            begin, start_node, start_devices = starts[wid]
            for device in start_devices:
                intervals[(start_node, device)].append((begin, int(t), wid))
    assert set(starts) == set(asked)
    for wid, (_t, _node, devices) in starts.items():
        assert len(set(devices)) == asked[wid], f"{wid} asked {asked[wid]} GPUs, saw {devices}"
    for device, runs in intervals.items():
        runs.sort()
        for (_b1, end1, w1), (begin2, _e2, w2) in itertools.pairwise(runs):
            assert begin2 >= end1, f"{device} given to {w1} and {w2} at once"
    # Each cycle told the kept placement state every start, end and change to the queue
    # since the last plan.
    assert fed.hub is not None and fed.hub.cycle.placement.untold == 0


async def test_cancel_kills_the_running_process(fed: InProcessFederation, tmp_path: Path) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    pid_file = tmp_path / "pid"
    wid = await fed.submit(
        name="long", team="vision", command=["sh", "-c", f"echo $$ > {pid_file}; exec sleep 60"]
    )
    await fed.wait_phase(wid, {Phase.RUNNING})
    await wait_until(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
    pid = int(pid_file.read_text())
    assert fed.api is not None
    response = await fed.api.delete(f"/v1/workloads/{wid}")
    assert response.status_code == 202
    record = await fed.wait_phase(wid, {Phase.CANCELLED, Phase.FAILED, Phase.SUCCEEDED})
    assert record["phase"] == "cancelled"
    await wait_until(lambda: not process_alive(pid), timeout=5)
    # The GPUs come back: a 2-GPU job fits again.
    again = await fed.submit(name="after", team="vision", gpus_per_node=2, command=["true"])
    assert (await fed.wait_phase(again, {Phase.SUCCEEDED, Phase.FAILED}))["phase"] == "succeeded"


def process_alive(pid: int) -> bool:
    """Running and not a zombie (an orphan may wait for a reaper that never comes)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def test_cancel_of_a_queued_workload_ends_it_at_once(fed: InProcessFederation) -> None:
    await fed.start_hub()
    wid = await fed.submit(name="nowhere", team="vision", command=["true"])
    assert fed.api is not None
    response = await fed.api.delete(f"/v1/workloads/{wid}")
    assert response.status_code == 202
    assert response.json()["phase"] == "cancelled"
    again = await fed.api.delete(f"/v1/workloads/{wid}")
    assert again.status_code == 409
    assert again.json()["code"] == "conflict"
    assert again.json()["message"] == f"workload {wid} has already ended (cancelled)"
    missing = await fed.api.delete("/v1/workloads/w-nope")
    assert missing.status_code == 404


async def test_failed_exit_code_is_reported(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    wid = await fed.submit(name="crash", team="vision", command=["sh", "-c", "exit 3"])
    record = await fed.wait_phase(wid, {Phase.FAILED, Phase.SUCCEEDED})
    assert record["phase"] == "failed"
    assert record["exit_code"] == 3
    missing = await fed.submit(name="typo", team="vision", command=["no-such-program-xyz"])
    record = await fed.wait_phase(missing, {Phase.FAILED, Phase.SUCCEEDED})
    assert record["exit_code"] == 127
    assert "no-such-program-xyz" in record["message"]
