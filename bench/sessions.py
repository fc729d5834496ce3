"""What sessions cost: the spoke's TCP relay in front of a session's port, and the hub's idle look.

Prints one JSON object:

- `relay_rtt_direct_us` / `relay_rtt_relayed_us`: median round trip of a 100-byte request and
  answer on one open connection, straight to a loopback echo server and through `PortRelay`;
- `relay_connect_us`: median time to open a connection through the relay and get a first answer
  (the relay opens its own to the workload on each one);
- `relay_mb_s`: bytes echoed through the relay per second, 64 KiB chunks;
- `decide_ms`: `hub.core.idle.decide` over `--workloads` running sessions and `dev` jobs, one
  in a hundred due to be stopped (the hub looks at most twice a second, and only when the
  policy sets `sessions:` limits or `idle.reclaim_after`).

    .venv/bin/python bench/sessions.py --rounds 2000 --workloads 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from hub.core.idle import Activity, IdleRules, SessionRules, Watched, decide
from schemas import WorkloadKind
from spoke.relay import PortRelay


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()


async def round_trips(port: int, rounds: int) -> list[float]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = b"x" * 100
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        writer.write(payload)
        await writer.drain()
        await reader.readexactly(len(payload))
        times.append(time.perf_counter() - start)
    writer.close()
    return times


async def connects(port: int, rounds: int) -> list[float]:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        await reader.readexactly(4)
        times.append(time.perf_counter() - start)
        writer.close()
        await writer.wait_closed()
    return times


async def throughput(port: int, megabytes: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    chunk = b"y" * 65536
    total = megabytes * 2**20

    async def send() -> None:
        for _ in range(total // len(chunk)):
            writer.write(chunk)
            await writer.drain()

    start = time.perf_counter()
    sender = asyncio.create_task(send())
    got = 0
    while got < total:
        got += len(await reader.read(65536))
    await sender
    writer.close()
    return total / 2**20 / (time.perf_counter() - start)


def decide_ms(count: int) -> tuple[float, int]:
    now = 1_000_000.0
    watched = [
        Watched(f"w{i}", WorkloadKind.SESSION if i % 2 else WorkloadKind.JOB, "dev", now - 600,
                Activity(now - (i % 3700), now - (i % 1900)))
        for i in range(count)
    ]  # fmt: skip
    rules, idle = SessionRules(1800.0, 43200.0), IdleRules(reclaim_after_s=3600.0)
    stops = len(decide(watched, rules, idle, now))
    start = time.perf_counter()
    for _ in range(10):
        decide(watched, rules, idle, now)
    return (time.perf_counter() - start) / 10 * 1000, stops


async def main(rounds: int, workloads: int) -> dict[str, float]:
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = server.sockets[0].getsockname()[1]
    relay = PortRelay("127.0.0.1", target)
    port = await relay.start()
    direct = await round_trips(target, rounds)
    relayed = await round_trips(port, rounds)
    opened = await connects(port, min(rounds, 500))
    mb_s = await throughput(port, 256)
    await asyncio.sleep(0.2)  # the echo handlers see their clients go
    await relay.close()
    server.close()
    took, stops = decide_ms(workloads)
    return {
        "relay_rtt_direct_us": round(statistics.median(direct) * 1e6, 1),
        "relay_rtt_relayed_us": round(statistics.median(relayed) * 1e6, 1),
        "relay_connect_us": round(statistics.median(opened) * 1e6, 1),
        "relay_mb_s": round(mb_s, 1),
        "decide_ms": round(took, 2),
        "workloads": workloads,
        "stops": stops,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--workloads", type=int, default=10_000)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rounds, args.workloads))))
