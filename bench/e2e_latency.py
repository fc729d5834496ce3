"""Submit → spoke-accepted latency of the embedded federation.

Starts NATS, the hub and three spokes as separate processes (as `gpufed up` does), submits
`--count` one-GPU workloads over NATS request/reply at a fixed `--rate`, and times each from the
moment its submission is sent to the moment its spoke reports it RUNNING (the spoke publishes
that once the process has started, then acks the Place command). Prints one JSON object.

    .venv/bin/python bench/e2e_latency.py --rate 200 --count 2000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bus.client import Bus, BusSettings
from gpufed.up import Federation, SimSpoke
from schemas import SubmitReply, WorkloadEvent, subjects

FLEET = (
    SimSpoke("eu-1", "eu", nodes=8, gpus=8, model="H100"),
    SimSpoke("eu-2", "eu", nodes=8, gpus=8, model="A100"),
    SimSpoke("us-1", "us", nodes=8, gpus=8, model="L4"),
)


async def measure(
    settings: BusSettings, rate: float, count: int, settle_s: float
) -> dict[str, object]:
    bus = Bus(settings)
    await bus.connect()
    sent_at: dict[str, float] = {}
    accepted_at: dict[str, float] = {}

    async def on_event(msg: object) -> None:
        event = WorkloadEvent.model_validate_json(msg.data)  # type: ignore[attr-defined]
        if event.phase == "running" and event.workload_id not in accepted_at:
            accepted_at[event.workload_id] = time.perf_counter()

    await bus.nc.subscribe(subjects.EVENTS_SUBJECTS, cb=on_event)
    spec = {"name": "bench", "team": "bench", "command": ["true"]}
    payload = json.dumps(spec).encode()
    errors = 0

    async def submit_one() -> None:
        nonlocal errors
        t = time.perf_counter()
        reply = SubmitReply.model_validate_json(
            (await bus.nc.request(subjects.SUBMIT, payload, 10)).data
        )
        if reply.ok and reply.workload_id:
            sent_at[reply.workload_id] = t
        else:
            errors += 1

    start = time.perf_counter()
    tasks = []
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(submit_one()))
        if i and i % max(1, count // 10) == 0:
            print(f"submitted {i}/{count}", file=sys.stderr, flush=True)
    await asyncio.gather(*tasks)
    achieved = count / (time.perf_counter() - start)
    deadline = time.perf_counter() + settle_s
    while len(accepted_at.keys() & sent_at.keys()) < len(sent_at):
        if time.perf_counter() > deadline:
            break
        await asyncio.sleep(0.05)
    await bus.close()
    latencies = sorted((accepted_at[w] - sent_at[w]) * 1000 for w in sent_at if w in accepted_at)
    return {
        "submitted": len(sent_at),
        "placed": len(latencies),
        "rate_per_s": round(achieved, 1),
        "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "p99_ms": round(latencies[int(0.99 * (len(latencies) - 1))], 2) if latencies else None,
        "max_ms": round(latencies[-1], 2) if latencies else None,
        "submit_errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="submissions per second")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds to wait at the end")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-") as tmp:
        fed = Federation(Path(tmp), api_port=0, fleet=FLEET)
        try:
            print("starting the embedded federation", file=sys.stderr, flush=True)
            fed.start()
            result = asyncio.run(
                measure(fed.client_settings("bench"), args.rate, args.count, args.settle)
            )
        finally:
            fed.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
