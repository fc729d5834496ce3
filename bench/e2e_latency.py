"""Submit → RUNNING latency and CPU cost of the embedded federation.

Starts NATS, the hub and three spokes as separate processes (as `gpufed up` does) and prints
JSON (never asserts a time):

- `--rate R --count C`: submits C one-GPU workloads over NATS request/reply at R per second and
  times each from the moment its submission is sent to the moment its spoke reports it RUNNING
  (the spoke publishes that once the process has started). Also prints the CPU milliseconds
  per placed workload of the hub, each spoke agent (its own, not its children's),
  nats-server, this process (`load-generator`) and the workloads' own processes (`workloads`:
  the spokes' children, their shell wrappers), from psutil: on one machine they all share its
  cores. `windows`: p50/p99 of the submissions sent in each 5 s, so a backlog that spoiled
  some seconds shows apart from the rest, with each side's p99: `to_place` (submission to
  its Place command, the hub) and `to_running` (Place to RUNNING, the spoke).
- `--sweep`: runs of `--sweep-seconds` each at 50, 100, 200, ... per second until p99 reaches
  50 ms (or a submission is lost), then bisects; prints every step and `max_sustainable_rate`.
  `--rates 50,100,200,400` runs those rates instead; `--plot FILE.png` draws p99 against rate
  from the steps of either.
- `--bulk N`: submits N workloads in batches (`submit_batch`, 1,000 per batch) and prints
  `all_running_s`, from the first submission to the last workload RUNNING on its spoke.
- `--dir DIR`: the federation's folders (store, logs, workspaces, run files) in a temporary
  folder made under DIR instead of the system's temp folder. Every workload costs two file
  creations (its workspace and its log; its exit code is a line appended to the spoke's exit
  log); on a file system where one costs hundreds of microseconds of CPU they are a large part
  of a run (`--dir /dev/shm` tells the federation's own cost from the file system's).
- `--keep-ended N`: each spoke keeps the files of its last N ended workloads (`gpufed spoke
  --keep-ended-max`; default 10,000, which a run of 12,000 passes only at its end), so a run
  pays from its first seconds for removing them, as a spoke running for hours does.

Every result carries `machine_ref_us` (`bench/machine.py`): how fast the machine ran the hub's
Python just before, to tell a slow hour from a slower commit.

    .venv/bin/python bench/e2e_latency.py --rate 400 --count 12000
    .venv/bin/python bench/e2e_latency.py --sweep --plot docs/e2e_p99_by_rate.png
    .venv/bin/python bench/e2e_latency.py --bulk 10000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import machine
import nats.errors
import psutil

from bus.client import Bus
from gpufed.compose.loop import run
from gpufed.up import UP_POLICY, Federation, SimSpoke
from schemas import EventPhase, SubmitBatchReply, SubmitReply, subjects

FLEET = (
    SimSpoke("eu-1", "eu", nodes=8, gpus=8, model="H100"),
    SimSpoke("eu-2", "eu", nodes=8, gpus=8, model="A100"),
    SimSpoke("us-1", "us", nodes=8, gpus=8, model="L4"),
)
SPOKE_IDS = frozenset(s.id for s in FLEET)
SPEC = {"name": "bench", "team": "bench", "command": ["true"]}
#: `gpufed up`'s policy, with room for a whole --bulk queued at once (the default team's
#: max_queued, 5,000, would refuse half of 10,000).
POLICY: dict[str, object] = {
    **UP_POLICY,
    "default_team": {**dict(UP_POLICY["default_team"]), "max_queued": 20_000},  # type: ignore[call-overload]
}
#: The sweep's bar: a rate is sustained when p99 stays under this and nothing is lost.
P99_LIMIT_MS = 50.0
RUNNING = EventPhase.RUNNING.value
BULK_BATCH = 1000
#: Seconds of submissions per entry of `windows`.
WINDOW_S = 5


class Probe:
    """CPU seconds (user + system, children excluded) of the federation's processes and of
    this one (the load generator); and, as `workloads`, of the spokes' children that ended
    (the workloads' wrappers: on one machine they take their share of it too)."""

    def __init__(self, fed: Federation) -> None:
        pids = {name: proc.pid for name, proc in fed.procs.items()}
        if fed.nats.pid is not None:
            pids["nats-server"] = fed.nats.pid
        pids["load-generator"] = os.getpid()  # this process: submissions and the watcher
        self.procs = {name: psutil.Process(pid) for name, pid in pids.items()}

    def sample(self) -> dict[str, float]:
        out = {"workloads": 0.0}
        for name, proc in self.procs.items():
            times = proc.cpu_times()
            out[name] = times.user + times.system
            if name in SPOKE_IDS:
                out["workloads"] += times.children_user + times.children_system
        return out


class Watcher:
    """Listens to every spoke's events and notes when each workload first ran, and to the
    hub's commands and notes when its Place went out (for the breakdown of the latency)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.running_at: dict[str, float] = {}
        self.placed_at: dict[str, float] = {}
        self.spoke_of: dict[str, str] = {}
        self.changed = asyncio.Event()

    async def start(self) -> None:
        await self.bus.nc.subscribe(subjects.EVENTS_SUBJECTS, cb=self._on_event)
        await self.bus.nc.subscribe(subjects.COMMANDS_SUBJECTS, cb=self._on_command)

    async def _on_command(self, msg: Any) -> None:
        now = time.perf_counter()
        data = json.loads(msg.data)
        for command in data if isinstance(data, list) else [data]:  # one, or several in order
            if command.get("kind") == "place":
                self.placed_at.setdefault(command["workload_id"], now)

    async def _on_event(self, msg: Any) -> None:
        now = time.perf_counter()
        data = json.loads(msg.data)  # one, or several in order (read as `parse_events` does)
        for event in data if isinstance(data, list) else [data]:
            workload_id = event["workload_id"]
            if event["phase"] == RUNNING and workload_id not in self.running_at:
                self.running_at[workload_id] = now
                self.spoke_of[workload_id] = event["spoke_id"]
                self.changed.set()

    async def wait_for(self, ids: set[str], settle_s: float) -> None:
        deadline = time.perf_counter() + settle_s
        while not ids <= self.running_at.keys() and time.perf_counter() < deadline:
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), 0.05)


async def run_rate(
    bus: Bus, watcher: Watcher, probe: Probe, rate: float, count: int, settle_s: float
) -> dict[str, Any]:
    sent_at: dict[str, float] = {}
    payload = json.dumps(SPEC).encode()
    errors = 0

    async def submit_one() -> None:
        nonlocal errors
        t = time.perf_counter()
        try:
            reply = SubmitReply.model_validate_json(
                (await bus.nc.request(subjects.SUBMIT, payload, 10)).data
            )
        except (TimeoutError, nats.errors.Error):
            errors += 1
            return
        if reply.ok and reply.workload_id:
            sent_at[reply.workload_id] = t
        else:
            errors += 1

    cpu_before = probe.sample()
    start = time.perf_counter()
    tasks = []
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(submit_one()))
    await asyncio.gather(*tasks)
    achieved = count / (time.perf_counter() - start)
    await watcher.wait_for(set(sent_at), settle_s)
    cpu_after = probe.sample()
    running_at = watcher.running_at
    placed_at = watcher.placed_at
    # window -> (submit to RUNNING, submit to Place, Place to RUNNING) of its submissions, s
    by_window: dict[int, tuple[list[float], list[float], list[float]]] = {}
    for w, t in sent_at.items():
        if w in running_at:
            total, hub, spoke = by_window.setdefault(int((t - start) // WINDOW_S), ([], [], []))
            total.append(running_at[w] - t)
            if w in placed_at:
                hub.append(placed_at[w] - t)
                spoke.append(running_at[w] - placed_at[w])
    latencies = sorted((running_at[w] - sent_at[w]) * 1000 for w in sent_at if w in running_at)
    placed = len(latencies)
    # Where the time went: the hub (submission to its Place command on the bus) and the
    # spoke (Place to RUNNING: fetching the command, starting the process, publishing).
    hub_ms = sorted(
        (watcher.placed_at[w] - sent_at[w]) * 1000 for w in sent_at if w in watcher.placed_at
    )
    spoke_ms = sorted(
        (running_at[w] - watcher.placed_at[w]) * 1000
        for w in sent_at
        if w in running_at and w in watcher.placed_at
    )
    return {
        "rate_asked_per_s": rate,
        "count": count,
        "submitted": len(sent_at),
        "placed": placed,
        "rate_per_s": round(achieved, 1),
        "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "p99_ms": round(latencies[int(0.99 * (placed - 1))], 2) if latencies else None,
        "max_ms": round(latencies[-1], 2) if latencies else None,
        "submit_errors": errors,
        "submit_to_place_ms": quantiles(hub_ms),
        "place_to_running_ms": quantiles(spoke_ms),
        # p50/p99 ms of the submissions sent in each WINDOW_S: a backlog (the first seconds
        # under load, a stall) shows as the windows it spoiled, not only as one p99; and the
        # p99 of each side, the hub's (submit to Place) and the spoke's (Place to RUNNING)
        "windows": [window(n, *by_window[n]) for n in sorted(by_window)],
        **cpu_figures(
            cpu_before, cpu_after, [watcher.spoke_of[w] for w in sent_at if w in running_at]
        ),
    }


def window(n: int, total: list[float], hub: list[float], spoke: list[float]) -> dict[str, Any]:
    """One entry of `windows`: its start, p50/p99/max ms, and each side's p99 ms."""
    sides = {
        f"{side}_p99": found["p99"]
        for side, values in (("to_place", hub), ("to_running", spoke))
        if (found := quantiles(sorted(v * 1000 for v in values)))
    }
    return {"from_s": n * WINDOW_S, **(quantiles(sorted(v * 1000 for v in total)) or {}), **sides}


def quantiles(values: list[float]) -> dict[str, float] | None:
    """p50, p99 and max of sorted `values` (ms)."""
    if not values:
        return None
    return {
        "p50": round(statistics.median(values), 2),
        "p99": round(values[int(0.99 * (len(values) - 1))], 2),
        "max": round(values[-1], 2),
    }


def timeline(times: list[float], start: float) -> dict[str, float] | None:
    """Seconds from `start` to the first, median and last of `times`."""
    if not times:
        return None
    ordered = sorted(times)
    return {
        "first": round(ordered[0] - start, 2),
        "p50": round(ordered[len(ordered) // 2] - start, 2),
        "last": round(ordered[-1] - start, 2),
    }


def waves(times: list[float], gap_s: float = 0.01) -> dict[str, float] | None:
    """Places come in waves, one per hub cycle that placed anything: how many, how many
    Places each (median), and the median time from one wave's start to the next's."""
    if not times:
        return None
    ordered = sorted(times)
    starts, sizes = [ordered[0]], [1]
    for before, t in itertools.pairwise(ordered):
        if t - before > gap_s:
            starts.append(t)
            sizes.append(0)
        sizes[-1] += 1
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(starts)]
    return {
        "count": len(starts),
        "median_size": statistics.median(sizes),
        "median_interval_ms": round(statistics.median(gaps), 1) if gaps else 0.0,
    }


def cpu_figures(
    before: dict[str, float], after: dict[str, float], spokes: list[str]
) -> dict[str, Any]:
    """CPU ms per workload: of each process over all workloads placed, and of each spoke
    agent over the workloads it ran."""
    used = {name: (after[name] - before[name]) * 1000 for name in before}
    ran = Counter(spokes)
    return {
        "cpu_ms_per_workload": {
            name: round(ms / max(1, len(spokes)), 3) for name, ms in used.items()
        },
        "spoke_cpu_ms_per_own_workload": {
            name: round(used[name] / count, 3) for name, count in ran.items() if name in used
        },
    }


def sustained(step: dict[str, Any]) -> bool:
    return (
        step["submit_errors"] == 0
        and step["placed"] == step["count"]
        and step["p99_ms"] is not None
        and step["p99_ms"] < P99_LIMIT_MS
    )


async def sweep(
    bus: Bus, watcher: Watcher, probe: Probe, seconds: float, settle_s: float
) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []

    async def at(rate: float) -> bool:
        step = await run_rate(bus, watcher, probe, rate, max(1, int(rate * seconds)), settle_s)
        steps.append(step)
        print(json.dumps(step), file=sys.stderr, flush=True)
        return sustained(step)

    good, bad, rate = 0.0, None, 50.0
    while bad is None and rate <= 6400:
        if await at(rate):
            good, rate = rate, rate * 2
        else:
            bad = rate
    if bad is not None:
        for _ in range(3):
            mid = round((good + bad) / 2)
            if mid in (good, bad):
                break
            if await at(mid):
                good = mid
            else:
                bad = mid
    return {
        "max_sustainable_rate": good,
        "p99_limit_ms": P99_LIMIT_MS,
        "seconds_per_step": seconds,
        "steps": steps,
    }


async def bulk(bus: Bus, watcher: Watcher, probe: Probe, n: int, settle_s: float) -> dict[str, Any]:
    ids: set[str] = set()
    refused = 0
    cpu_before = probe.sample()
    start = time.perf_counter()
    for first in range(0, n, BULK_BATCH):
        size = min(BULK_BATCH, n - first)
        payload = json.dumps([SPEC] * size).encode()
        reply = SubmitBatchReply.model_validate_json(
            (await bus.nc.request(subjects.SUBMIT_BATCH, payload, 30)).data
        )
        refused += reply.refused + (size if reply.error else 0)
        ids.update(r.workload_id for r in reply.results if r.ok and r.workload_id)
    submitted_s = time.perf_counter() - start
    await watcher.wait_for(ids, settle_s)
    cpu_after = probe.sample()
    ran = [watcher.running_at[w] for w in ids if w in watcher.running_at]
    placed = [watcher.placed_at[w] for w in ids if w in watcher.placed_at]
    spoke_ms = sorted(
        (watcher.running_at[w] - watcher.placed_at[w]) * 1000
        for w in ids
        if w in watcher.running_at and w in watcher.placed_at
    )
    return {
        "bulk": n,
        "accepted": len(ids),
        "refused": refused,
        "running": len(ran),
        "submit_s": round(submitted_s, 2),
        "all_running_s": round(max(ran) - start, 2) if len(ran) == len(ids) and ran else None,
        # Where the time went: seconds from the first submission to the first, middle and
        # last Place on the command stream (the hub's pace) and RUNNING (the spokes').
        "place_s": timeline(placed, start),
        "running_s": timeline(ran, start),
        "place_to_running_ms": quantiles(spoke_ms),
        "place_waves": waves(placed),
        **cpu_figures(
            cpu_before, cpu_after, [watcher.spoke_of[w] for w in ids if w in watcher.running_at]
        ),
    }


def plot(series: dict[str, dict[str, Any]], path: Path) -> None:
    """p99 against rate, one line per labelled result (each with `steps`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for label, result in series.items():
        steps = sorted(result["steps"], key=lambda s: s["rate_asked_per_s"])
        rates = [s["rate_asked_per_s"] for s in steps]
        p99 = [s["p99_ms"] or float("nan") for s in steps]
        load = result.get("load_average_1m")
        ax.plot(rates, p99, marker="o", label=f"{label} (load {load})" if load else label)
    ax.axhline(P99_LIMIT_MS, color="grey", linestyle="--", label=f"{P99_LIMIT_MS:g} ms")
    ax.set_xlabel("submissions per second")
    ax.set_ylabel("p99 submit → running (ms)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(f"embedded federation, {os.cpu_count()} cores")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


async def measure(fed: Federation, args: argparse.Namespace) -> dict[str, Any]:
    bus = Bus(fed.client_settings("bench"))
    await bus.connect()
    watcher = Watcher(bus)
    await watcher.start()
    probe = Probe(fed)
    try:
        if args.bulk:
            result = await bulk(bus, watcher, probe, args.bulk, args.settle)
        elif args.rates:
            steps = []
            for rate in args.rates:
                count = max(1, int(rate * args.sweep_seconds))
                steps.append(await run_rate(bus, watcher, probe, rate, count, args.settle))
                print(json.dumps(steps[-1]), file=sys.stderr, flush=True)
            result = {"seconds_per_step": args.sweep_seconds, "steps": steps}
        elif args.sweep:
            result = await sweep(bus, watcher, probe, args.sweep_seconds, args.settle)
        else:
            result = await run_rate(bus, watcher, probe, args.rate, args.count, args.settle)
    finally:
        await bus.close()
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    result["cpus"] = os.cpu_count()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="submissions per second")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--settle", type=float, default=30.0, help="seconds to wait at the end")
    parser.add_argument("--sweep", action="store_true", help="find the highest sustained rate")
    parser.add_argument("--sweep-seconds", type=float, default=10.0, help="length of a step")
    parser.add_argument(
        "--rates",
        type=lambda text: [float(r) for r in text.split(",")],
        help="comma-separated rates to run, --sweep-seconds each (for a plot)",
    )
    parser.add_argument("--plot", type=Path, help="with --sweep/--rates: PNG of p99 by rate")
    parser.add_argument("--bulk", type=int, default=0, help="submit this many in batches")
    parser.add_argument("--dir", type=Path, help="make the federation's folder under this one")
    parser.add_argument(
        "--keep-ended", type=int, help="spokes keep the files of their last N ended workloads"
    )
    parser.add_argument(
        "--replot",
        nargs="+",
        metavar="LABEL=RESULT.json",
        help="with --plot: draw saved --sweep/--rates results instead of running",
    )
    args = parser.parse_args()
    if args.replot:
        series = {}
        for item in args.replot:
            label, _, file = item.partition("=")
            series[label] = json.loads(Path(file).read_text().splitlines()[-1])
        plot(series, args.plot or Path("e2e_p99_by_rate.png"))
        return
    machine_ref_us = machine.reference_us()  # before anything of ours runs beside it
    with tempfile.TemporaryDirectory(prefix="gpufed-bench-", dir=args.dir) as tmp:
        keep = () if args.keep_ended is None else ("--keep-ended-max", str(args.keep_ended))
        spoke_args = ("--stop-workloads-on-exit", *keep)
        fed = Federation(Path(tmp), api_port=0, fleet=FLEET, policy=POLICY, spoke_args=spoke_args)
        try:
            print("starting the embedded federation", file=sys.stderr, flush=True)
            fed.start()
            result = run(measure(fed, args))  # on the hub's loop (uvloop): a lighter generator
        finally:
            fed.stop()
    result["machine_ref_us"] = machine_ref_us
    if args.plot and "steps" in result:
        plot({"this commit": result}, args.plot)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
