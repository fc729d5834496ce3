"""Hub CPU per workload in closed-loop waves: a figure the machine's load moves little.

At a steady rate the hub's CPU per workload depends on how many workloads each fetch, save and
cycle carries, which depends on how busy the machine is: a loaded machine makes the hub fall
behind, its batches grow and its cost per workload falls. Here the federation of
`bench/e2e_latency.py` gets waves of `--size` submissions at once; the next wave goes once every
workload of the last has ended (its spoke's SUCCEEDED event seen) and `--pause` has passed, so
each wave is taken, placed and finished in batches of about its size whatever the load.
Prints the hub's CPU milliseconds per workload, all threads and its main thread (the event
loop), over `--waves` waves after 20 of warm-up.

    .venv/bin/python bench/hub_waves.py --size 8 --waves 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from e2e_latency import FLEET, POLICY, SPEC

from bus.client import Bus
from gpufed.up import Federation
from schemas import EventPhase, SubmitReply, parse_events, subjects

WARM_UP = 20


async def measure(fed: Federation, size: int, waves: int, pause_s: float) -> dict[str, Any]:
    bus = Bus(fed.client_settings("bench"))
    await bus.connect()
    ended: set[str] = set()
    changed = asyncio.Event()

    async def on_event(msg: Any) -> None:
        for event in parse_events(msg.data):  # one, or several in order
            if event.phase in (EventPhase.SUCCEEDED, EventPhase.FAILED):
                ended.add(event.workload_id)
                changed.set()

    await bus.nc.subscribe(subjects.EVENTS_SUBJECTS, cb=on_event)
    hub = psutil.Process(fed.procs["hub"].pid)
    payload = json.dumps(SPEC).encode()

    def cpu() -> tuple[float, float]:
        times = hub.cpu_times()
        main = next(t for t in hub.threads() if t.id == hub.pid)
        return times.user + times.system, main.user_time + main.system_time

    async def submit() -> str:
        reply = await bus.nc.request(subjects.SUBMIT, payload, 30)
        workload_id = SubmitReply.model_validate_json(reply.data).workload_id
        assert workload_id is not None
        return workload_id

    async def wave() -> None:
        ids = set(await asyncio.gather(*(submit() for _ in range(size))))
        while not ids <= ended:
            changed.clear()
            waiter = asyncio.ensure_future(changed.wait())
            await asyncio.wait([waiter], timeout=0.05)
            waiter.cancel()
        await asyncio.sleep(pause_s)

    for _ in range(WARM_UP):
        await wave()
    total0, main0 = cpu()
    start = time.perf_counter()
    for _ in range(waves):
        await wave()
    wall = time.perf_counter() - start
    total1, main1 = cpu()
    await bus.close()
    n = size * waves
    return {
        "size": size,
        "waves": waves,
        "wall_s": round(wall, 1),
        "hub_cpu_ms_per_workload": round((total1 - total0) * 1000 / n, 3),
        "hub_main_thread_cpu_ms_per_workload": round((main1 - main0) * 1000 / n, 3),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--size", type=int, default=8, help="submissions per wave")
    parser.add_argument("--waves", type=int, default=200)
    parser.add_argument("--pause", type=float, default=0.03, help="seconds between waves")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufed-waves-") as tmp:
        fed = Federation(Path(tmp), api_port=0, fleet=FLEET, policy=POLICY)
        try:
            fed.start()
            result = asyncio.run(measure(fed, args.size, args.waves, args.pause))
        finally:
            fed.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
