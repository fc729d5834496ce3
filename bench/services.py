"""What an inference service costs in time: start, scale-up, wake from zero, gateway overhead.

    .venv/bin/python bench/services.py [--requests 400] [--concurrency 8]

Runs `gpufed up`'s processes (NATS, hub, one spoke, no burst) with `gpufed.replica` as the
replica (no inference delay) and prints one JSON object:

- first_ready_s: from `POST /v1/services` until its replica is ready (placed, started,
  healthy);
- scale_up_to_max_s: from the start of a steady load (`--concurrency` at a time) until the
  service has all `max_replicas` ready;
- gateway_rps / direct_rps: requests per second through the gateway vs. straight at one
  replica's URL, same client and concurrency; gateway_p50_ms / direct_p50_ms likewise;
- wake_from_zero_s: a service at zero replicas: the first request's latency (it waits at the
  gateway for a replica).
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
from typing import Any

import httpx

from gpufed.up import Federation, SimSpoke

FLEET = (SimSpoke("us-1", "us", nodes=1, gpus=4, model="L4", price=0.8),)
TEAM = "bench"


def spec(name: str, **over: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": TEAM,
        "replica": {"command": [sys.executable, "-m", "gpufed.replica"], "gpu_fraction": 0.25},
        "health": {"path": "/health", "period_s": 0.2},
        **over,
    }


async def until(api: httpx.AsyncClient, name: str, check: Any) -> dict[str, Any]:
    while True:
        status = (await api.get(f"/v1/services/{TEAM}/{name}")).json()
        if check(status):
            return dict(status)
        await asyncio.sleep(0.05)


async def hammer(
    client: httpx.AsyncClient, url: str, count: int, concurrency: int
) -> tuple[float, list[float]]:
    """`count` GETs of `url`, `concurrency` at a time: (requests per second, latencies)."""
    latencies: list[float] = []
    left = [count]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            started = time.perf_counter()
            answer = await client.get(url)
            answer.raise_for_status()
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return count / (time.perf_counter() - started), latencies


async def measure(fed: Federation, requests: int, concurrency: int) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {fed.admin_token}"}
    async with httpx.AsyncClient(
        base_url=fed.api_url, headers=headers, timeout=120, trust_env=False
    ) as api:
        started = time.perf_counter()
        made = await api.post("/v1/services", json=spec("one", replicas=1))
        made.raise_for_status()
        status = await until(api, "one", lambda s: s["ready"] == 1)
        first_ready = time.perf_counter() - started
        direct_url = status["replicas"][0]["endpoint"] + "/x"
        gateway_rps, via = await hammer(api, f"/svc/{TEAM}/one/x", requests, concurrency)
        direct_rps, direct = await hammer(api, direct_url, requests, concurrency)

        scaling = {"target": 5, "window_s": 2, "scale_down_delay_s": 5}
        made = await api.post(
            "/v1/services", json=spec("many", min_replicas=1, max_replicas=3, autoscaling=scaling)
        )
        made.raise_for_status()
        await until(api, "many", lambda s: s["ready"] == 1)
        load = asyncio.create_task(
            hammer(api, f"/svc/{TEAM}/many/x", requests * 100, max(2, concurrency // 4))
        )
        started = time.perf_counter()
        await until(api, "many", lambda s: s["ready"] == 3)
        scale_up = time.perf_counter() - started
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)

        zero = {"scale_to_zero_after_s": 1, "scale_down_delay_s": 0}
        made = await api.post(
            "/v1/services", json=spec("zero", min_replicas=0, max_replicas=1, autoscaling=zero)
        )
        made.raise_for_status()
        await until(api, "zero", lambda s: s["ready"] == 1)
        await until(api, "zero", lambda s: not s["replicas"])
        started = time.perf_counter()
        (await api.get(f"/svc/{TEAM}/zero/x")).raise_for_status()
        wake = time.perf_counter() - started
    return {
        "requests": requests,
        "concurrency": concurrency,
        "first_ready_s": round(first_ready, 3),
        "scale_up_to_max_s": round(scale_up, 3),
        "gateway_rps": round(gateway_rps, 1),
        "direct_rps": round(direct_rps, 1),
        "gateway_p50_ms": round(statistics.median(via) * 1000, 2),
        "direct_p50_ms": round(statistics.median(direct) * 1000, 2),
        "wake_from_zero_s": round(wake, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-services-") as tmp:
        fed = Federation(Path(tmp), api_port=0, fleet=FLEET)
        try:
            fed.start()
            result = asyncio.run(measure(fed, args.requests, args.concurrency))
        finally:
            fed.stop()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
