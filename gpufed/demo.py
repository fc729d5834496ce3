"""`gpufed up --demo`: submit a mixed workload, show progress, print a summary."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

from gpufed.client import ApiError, HubClient
from gpufed.demo_services import ServingDemo

#: (name, team, priority, nodes, gpus per node, models, fraction, seconds)
DEMO_JOBS: list[tuple[str, str, str, int, int, list[str], float | None, float]] = [
    ("resnet-sweep-1", "vision", "batch", 1, 1, [], None, 2),
    ("resnet-sweep-2", "vision", "batch", 1, 1, [], None, 2),
    ("resnet-sweep-3", "vision", "batch", 1, 1, [], None, 3),
    ("tokenizer-eval", "nlp", "dev", 1, 1, [], None, 1),
    ("asr-finetune", "speech", "training", 1, 2, ["A100", "H100"], None, 3),
    ("bert-large", "nlp", "training", 1, 4, ["A100"], None, 3),
    ("vit-huge", "vision", "training", 1, 8, ["H100"], None, 4),
    ("llm-pretrain", "research", "training", 2, 8, ["H100"], None, 5),
    ("diffusion-xl", "vision", "training", 1, 8, ["L4"], None, 3),
    ("whisper-distill", "speech", "batch", 1, 4, ["L4"], None, 2),
    ("notebook-alice", "research", "dev", 1, 1, ["L4"], 0.5, 2),
    ("notebook-bob", "research", "dev", 1, 1, ["L4"], 0.5, 2),
    ("embed-batch-1", "nlp", "batch", 1, 2, ["L4"], None, 2),
    ("embed-batch-2", "nlp", "batch", 1, 2, ["L4"], None, 2),
    ("rl-rollouts", "research", "batch", 1, 4, [], None, 3),
    ("seg-train", "vision", "training", 1, 4, ["H100", "A100"], None, 3),
    ("tts-vocoder", "speech", "batch", 1, 1, ["L4"], None, 1),
    ("moe-ablation", "research", "training", 1, 8, ["H100"], None, 3),
    ("ocr-eval", "vision", "batch", 1, 2, [], None, 1),
    ("ner-sweep", "nlp", "batch", 1, 1, [], None, 1),
    # A spike of H100 work beyond what the on-prem fleet has: it waits, burst rents cloud
    # H100s for it, and gives them back once they fall idle.
    ("vit-sweep-1", "vision", "training", 1, 8, ["H100"], None, 8),
    ("vit-sweep-2", "vision", "training", 1, 8, ["H100"], None, 8),
    ("vit-sweep-3", "vision", "training", 1, 8, ["H100"], None, 8),
    ("vit-sweep-4", "vision", "training", 1, 8, ["H100"], None, 8),
]

PROGRESS_EVERY_S = 1.0
TIMEOUT_S = 150.0


def demo_specs() -> list[dict[str, Any]]:
    specs = []
    for name, team, prio, nodes, gpus, models, fraction, seconds in DEMO_JOBS:
        spec: dict[str, Any] = {
            "name": name,
            "team": team,
            "priority_class": prio,
            "nodes": nodes,
            "gpus_per_node": gpus,
            "gpu_models": models,
            "command": ["sh", "-c", f'echo "GPUs $CUDA_VISIBLE_DEVICES"; sleep {seconds}'],
            "max_runtime_s": 120,
        }
        if fraction is not None:
            spec["gpu_fraction"] = fraction
        specs.append(spec)
    return specs


#: How long the demo waits for burst to give its cloud instances back.
RELEASE_TIMEOUT_S = 60.0


def run_demo(api_url: str, token: str | None = None) -> tuple[int, int]:
    """Open a notebook session, start an inference service, submit the demo jobs, drive load at
    the service, wait for the jobs, print the summary: (went well, tried), where the session
    and service together count as one."""
    client = HubClient(api_url, token=token)
    try:
        return _run(client, ServingDemo(client, api_url, token))
    except ApiError as exc:
        print(f"gpufed demo: {exc}")
        return 0, len(DEMO_JOBS) + 1
    finally:
        client.close()


def _run(client: HubClient, serving: ServingDemo) -> tuple[int, int]:
    specs = demo_specs()
    start = time.monotonic()
    print()
    serving.start()
    ids = [client.submit(spec)["id"] for spec in specs]
    print(f"submitted {len(ids)} workloads from {len({s['team'] for s in specs})} teams")
    serving.check_notebook()
    serving.drive_load()
    records: dict[str, dict[str, Any]] = {}
    last_line = ""
    while time.monotonic() - start < TIMEOUT_S:
        records = {r["id"]: r for r in client.workloads(limit=len(ids) + 100) if r["id"] in ids}
        phases = Counter(r["phase"] for r in records.values())
        line = "  ".join(
            f"{p} {phases.get(p, 0)}"
            for p in ("queued", "placed", "running", "succeeded", "failed", "cancelled")
        )
        if line != last_line:
            print(f"  {time.monotonic() - start:5.1f}s  {line}", flush=True)
            last_line = line
        if sum(phases.get(p, 0) for p in ("succeeded", "failed", "cancelled")) == len(ids):
            break
        time.sleep(PROGRESS_EVERY_S / 4)
    serving.watch_scale_down()
    _summary([records.get(i) or client.workload(i) for i in ids])
    served = serving.finish()
    _burst_summary(client)
    ok = sum(1 for i in ids if records.get(i, {}).get("phase") == "succeeded")
    return ok + served, len(ids) + 1


def _burst_summary(client: HubClient) -> None:
    """Wait for burst to give its instances back, then show what it rented and what it cost."""
    start = time.monotonic()
    instances = client.burst_instances()
    if instances:
        print("waiting for burst to release its idle cloud instances ...", flush=True)
    while any(i["state"] in ("requested", "running", "terminating") for i in instances):
        if time.monotonic() - start > RELEASE_TIMEOUT_S:
            break
        time.sleep(0.5)
        instances = client.burst_instances()
    if not instances:
        print("burst: no cloud instance was needed\n")
        return
    print("burst instance                 type           market     team     state")
    for i in instances:
        print(
            f"{i['burst_id']:30} {i['instance_type']:14} {i['market']:10} {i['team']:8} "
            f"{i['state']}"
        )
    totals = client.usage()["totals"]
    print(
        f"cloud: {totals['gpu_hours_cloud'] * 3600:.1f} GPU-seconds of work, "
        f"${totals['cloud_cost']:.4f} billed for the instances (boot, idle and busy)\n"
    )


def _summary(records: list[dict[str, Any]]) -> None:
    print("\nworkload          team      gpus   spoke                 wait     run      phase")
    gpu_seconds: dict[str, float] = defaultdict(float)
    for r in records:
        spec = r["spec"]
        gpus = spec.get("gpu_fraction") or spec["gpus_per_node"] * spec["nodes"]
        for a in r["attempts"]:  # each run on the spoke it ran on
            if a["started_at"] is not None and a["ended_at"] is not None:
                gpu_seconds[a["spoke_id"]] += (a["ended_at"] - a["started_at"]) * gpus
        wait = "-" if r.get("wait_s") is None else f"{r['wait_s']:.2f}s"
        run = "-" if r.get("run_s") is None else f"{r['run_s']:.2f}s"
        print(
            f"{spec['name']:17} {spec['team']:9} {gpus:<6g} {r['spoke_id'] or '-':21} "
            f"{wait:8} {run:8} {r['phase']}"
        )
    print("\nspoke                 GPU-seconds used")
    for spoke, used in sorted(gpu_seconds.items()):
        print(f"{spoke:21} {used:8.1f}")
    print()
