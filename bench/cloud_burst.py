"""Cloud burst under a demand spike, with the local provider.

Starts NATS, the hub and one small on-prem spoke (one node, `--onprem-gpus` L4s) as separate
processes (as `gpufed up` does), plus `gpufed burst --provider local` with a simulated catalog
(one or four L4s per instance). Submits `--jobs` one-GPU L4 jobs of `--job-s` seconds at once:
the on-prem spoke takes what it can, the rest becomes demand, and burst launches cloud spokes
that the hub places the rest on; once they sit idle for `--idle-ttl` they are released. Prints
one JSON object:

- `time_to_launch_s`: spike → first `requested` instance event (includes `burst_after`),
- `time_to_first_cloud_placement_s`: spike → first capacity report of a cloud spoke that lists
  a running workload,
- `idle_release_s`: last cloud workload gone from its spoke's report → its instance
  `terminated` (idle_ttl plus detection),
- `cloud_cost`: $ of the instances, price * (terminated - requested),
- `flaps`: launches of a shape (team, instance type) within `cooldown` after a termination of
  that shape (must be 0).

    .venv/bin/python bench/cloud_burst.py --jobs 6 --job-s 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from nats.aio.msg import Msg

from bus.client import Bus, BusSettings
from gpufed import logs
from gpufed.up import Federation, SimSpoke
from schemas import subjects
from schemas.burst import BURST_INSTANCES, InstanceEvent, InstanceState
from schemas.capacity import CapacityReport, SpokeKind

REGION = "us-east-1"
CATALOG = {
    "as_of": "2025-01-15",
    "source": "bench: simulated L4 instances",
    "instance_types": [
        {
            "name": "sim.l4x1",
            "gpu_model": "L4",
            "gpu_count": 1,
            "gpu_memory_gib": 24,
            "vcpus": 4,
            "prices": {REGION: {"on_demand": 0.80}},
        },
        {
            "name": "sim.l4x4",
            "gpu_model": "L4",
            "gpu_count": 4,
            "gpu_memory_gib": 24,
            "vcpus": 16,
            "prices": {REGION: {"on_demand": 3.00}},
        },
    ],
}


class Watch:
    """Instance events and cloud capacity reports, timed on arrival."""

    def __init__(self) -> None:
        self.events: list[InstanceEvent] = []
        self.first_cloud_busy: float | None = None
        self.cloud_busy_until: dict[str, float] = {}  # spoke -> last report with work
        self._busy: dict[str, bool] = {}

    async def on_instance(self, msg: Msg) -> None:
        self.events.append(InstanceEvent.model_validate_json(msg.data))

    async def on_capacity(self, msg: Msg) -> None:
        report = CapacityReport.model_validate_json(msg.data)
        if report.kind is not SpokeKind.CLOUD:
            return
        now = time.time()
        if report.running:
            if self.first_cloud_busy is None:
                self.first_cloud_busy = now
            self.cloud_busy_until[report.spoke_id] = now
            self._busy[report.spoke_id] = True
        elif self._busy.get(report.spoke_id):
            self._busy[report.spoke_id] = False
            self.cloud_busy_until[report.spoke_id] = now  # first idle report

    def first(self, state: InstanceState) -> dict[str, InstanceEvent]:
        found: dict[str, InstanceEvent] = {}
        for event in self.events:
            if event.state is state and event.burst_id not in found:
                found[event.burst_id] = event
        return found


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    fleet = (SimSpoke("dc-1", "us", nodes=1, gpus=args.onprem_gpus, model="L4"),)
    fed = Federation(root, 0, fleet)
    catalog = root / "catalog.yaml"
    bus = Bus(BusSettings(url="nats://unset", name="bench-burst"))
    try:
        fed.start()
        catalog.write_text(yaml.safe_dump(CATALOG))
        bus = Bus(fed.client_settings("bench-burst"))
        await bus.connect()
        watch = Watch()
        await bus.nc.subscribe(BURST_INSTANCES, cb=watch.on_instance)
        await bus.nc.subscribe(subjects.CAPACITY_SUBJECTS, cb=watch.on_capacity)
        fed.burst_args = _burst_args(args, catalog)
        fed.start_burst()
        burst = fed.procs["burst"]
        log = fed.log_dir / "burst.log"
        while "burst_ready" not in log.read_text():  # it has loaded the hub's state
            if burst.poll() is not None:
                raise RuntimeError(f"burst exited with {burst.returncode}; see {log}")
            await asyncio.sleep(0.1)
        client = fed.client()
        spike = time.time()
        ids = [
            client.submit(
                {
                    "name": f"spike-{n}",
                    "team": "ml",
                    "gpu_models": ["L4"],
                    "command": ["sleep", str(args.job_s)],
                }
            )["id"]
            for n in range(args.jobs)
        ]
        deadline = time.time() + args.timeout
        while time.time() < deadline:
            phases = {client.workload(w)["phase"] for w in ids}
            released = watch.first(InstanceState.TERMINATED)
            launched = watch.first(InstanceState.REQUESTED)
            if phases <= {"succeeded", "failed"} and launched and set(launched) <= set(released):
                break
            if burst.poll() is not None:
                raise RuntimeError(f"burst exited with {burst.returncode}; see {root / 'logs'}")
            await asyncio.sleep(0.2)
        await asyncio.sleep(args.cooldown + 1)  # would anything launch again right away?
        placed = {w: client.workload(w) for w in ids}
        client.close()
        return _result(args, watch, spike, placed)
    finally:
        await bus.close()
        fed.stop()  # burst, then the cloud spokes it left running, then the rest


def _burst_args(args: argparse.Namespace, catalog: Path) -> tuple[str, ...]:
    return (
        "--catalog", str(catalog),
        "--tick", "0.5",
        "--burst-after", str(args.burst_after),
        "--idle-ttl", str(args.idle_ttl),
        "--cooldown", str(args.cooldown),
        "--reconcile-every", "2",
        "--spoke-heartbeat", "0.5",
    )  # fmt: skip


def _result(
    args: argparse.Namespace, watch: Watch, spike: float, placed: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    requested = watch.first(InstanceState.REQUESTED)
    terminated = watch.first(InstanceState.TERMINATED)
    first_launch = min((e.at for e in requested.values()), default=None)
    releases = [
        terminated[b].at - watch.cloud_busy_until[b]
        for b in terminated
        if b in watch.cloud_busy_until
    ]
    cost = sum(
        e.price_per_hour * (terminated[b].at - e.at) / 3600.0
        for b, e in requested.items()
        if b in terminated
    )
    return {
        "jobs": args.jobs,
        "onprem_gpus": args.onprem_gpus,
        "burst_after_s": args.burst_after,
        "idle_ttl_s": args.idle_ttl,
        "instances": sorted(e.instance_type for e in requested.values()),
        "time_to_launch_s": None if first_launch is None else round(first_launch - spike, 2),
        "time_to_first_cloud_placement_s": (
            None if watch.first_cloud_busy is None else round(watch.first_cloud_busy - spike, 2)
        ),
        "idle_release_s": round(max(releases), 2) if releases else None,
        "cloud_cost": round(cost, 6),
        "flaps": _flaps(watch.events, args.cooldown),
        "succeeded": sum(1 for w in placed.values() if w["phase"] == "succeeded"),
        "on_cloud": sum(1 for w in placed.values() if w.get("spoke_id") in requested),
        "unreleased": sorted(set(requested) - set(terminated)),
    }


def _flaps(events: list[InstanceEvent], cooldown_s: float) -> int:
    """Launches of a (team, instance type) within cooldown_s after one of its terminations."""
    released_at: dict[tuple[str, str], float] = {}
    flaps = 0
    for event in sorted(events, key=lambda e: e.at):
        shape = (event.team, event.instance_type)
        if event.state is InstanceState.TERMINATED:
            released_at[shape] = event.at
        elif (
            event.state is InstanceState.REQUESTED
            and event.reason == "launch requested"
            and event.at - released_at.get(shape, float("-inf")) < cooldown_s
        ):
            flaps += 1
    return flaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--job-s", type=float, default=4.0)
    parser.add_argument("--onprem-gpus", type=int, default=2)
    parser.add_argument("--burst-after", type=float, default=1.0)
    parser.add_argument("--idle-ttl", type=float, default=3.0)
    parser.add_argument("--cooldown", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args()
    logs.configure(sys.stderr, json=False, level="warning")  # stdout carries the result only
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-burst-") as tmp:
        result = asyncio.run(run(args, Path(tmp)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
