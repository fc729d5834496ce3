"""Chaos soak: a real federation under seeded random faults, judged by the workloads' own records.

    .venv/bin/python bench/chaos.py --minutes 5 --seed 1

Runs nats-server, two hub replicas on an embedded PostgreSQL and three spokes (each reaching
NATS through its own cuttable TCP link), all as `gpufed up` runs them (its supervisor starts
again whatever dies). A steady mixed workload is submitted through the REST API (the client
follows the leader): single GPUs, two GPUs, two-node gangs and half GPUs, some restartable.
Every run appends "start" and "end" lines (workload, epoch, node rank, time) to one file.
Meanwhile faults come at random times from a schedule fixed by the seed: SIGKILL of the leading
hub, of the standby, of a spoke, of nats-server, and a spoke's link cut for less than the fence
(`cut_short`), for longer than the fence but less than `lost_after` (`cut_fenced`), and for
longer than `lost_after` (`cut_lost`: its work moves).

At the end (faults stop, everything runs again) it waits for every accepted workload to end
and prints one JSON object; `ok` is true when all of these are 0:
- lost: accepted workloads the hub does not know; stuck: accepted ones that never ended;
- overlapping_runs: workloads (accepted or not) two of whose runs (different epochs) overlap
  in time, from the file (a run with no "end" line counts as running until the check);
- doubled: `restart_policy: never` workloads that started under more than one epoch;
- succeeded_unrun: workloads the hub calls succeeded that never wrote a "start".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpufed.backoff import Backoff
from gpufed.client import ApiError, HubClient
from gpufed.postgres import EmbeddedPostgres
from gpufed.up import Federation, SimSpoke
from tests.integration.proxy import CuttableProxy

FLEET = (
    SimSpoke("eu-1", "eu", nodes=2, gpus=4, model="H100"),
    SimSpoke("eu-2", "eu", nodes=2, gpus=4, model="A100"),
    SimSpoke("us-1", "us", nodes=2, gpus=4, model="L4"),
)
SUSPECT_AFTER_S = 3.0
LOST_AFTER_S = 12.0
#: The spokes' fence: lost_after less their stop grace (5 s) and three 1 s heartbeats.
FENCE_AFTER_S = LOST_AFTER_S - 5.0 - 3.0
#: Faults and how often each is drawn.
KINDS = {
    "kill_leader": 3,
    "kill_standby": 2,
    "kill_spoke": 3,
    "kill_nats": 2,
    "cut_short": 2,
    "cut_fenced": 1,
    "cut_lost": 1,
}
TERMINAL = {"succeeded", "failed", "cancelled"}
#: How long the end waits for every accepted workload to end.
DRAIN_S = 300.0


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds after the start of the soak
    kind: str
    target: str  # a spoke id for kill_spoke and cuts, else ""
    hold_s: float  # how long a cut lasts


def fault_schedule(seed: int, seconds: float) -> list[Fault]:
    """The faults of a soak: the same seed, the same schedule (about one every 5 s)."""
    rng = random.Random(seed)
    spokes = [s.id for s in FLEET]
    faults = []
    at = rng.uniform(3.0, 6.0)
    while at < seconds:
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        target = rng.choice(spokes) if kind == "kill_spoke" or kind.startswith("cut") else ""
        hold = {
            "cut_short": rng.uniform(1.0, FENCE_AFTER_S - 2.0),
            "cut_fenced": rng.uniform(FENCE_AFTER_S + 1.0, LOST_AFTER_S - 3.0),
            "cut_lost": rng.uniform(LOST_AFTER_S + 2.0, LOST_AFTER_S + 6.0),
        }.get(kind, 0.0)
        faults.append(Fault(round(at, 2), kind, target, round(hold, 2)))
        at += rng.uniform(2.0, 8.0)
    return faults


def workload_spec(rng: random.Random, n: int, runs_file: Path) -> dict[str, Any]:
    """One workload of the mix; its runs record themselves in `runs_file`."""
    shape = rng.choice(["one", "two", "gang", "half"])
    seconds = round(rng.uniform(0.5, 4.0), 2)
    line = (
        f'line() {{ echo "$1 $GPUFED_WORKLOAD_ID ${{GPUFED_EPOCH:-0}} ${{GPUFED_NODE_RANK:-0}} '
        f'$(date +%s.%N)" >> {runs_file}; }}'
    )
    script = f"{line}; line start; trap 'line end; exit 143' TERM INT; sleep {seconds} & wait $!"
    script += "; line end"
    spec: dict[str, Any] = {
        "name": f"chaos-{n}-{shape}",
        "team": rng.choice(["vision", "nlp", "speech"]),
        "command": ["sh", "-c", script],
        "restart_policy": rng.choice(["never", "on_failure"]),
        "max_restarts": 20,
    }
    if shape == "two":
        spec["gpus_per_node"] = 2
    elif shape == "gang":
        spec.update(nodes=2, gpus_per_node=2)
    elif shape == "half":
        spec["gpu_fraction"] = 0.5
    return spec


class Soak:
    """One soak: the federation, its links, the submitter, the faults and the supervisor."""

    def __init__(self, root: Path, store_url: str, seed: int, seconds: float) -> None:
        hub_args = ("--suspect-after", str(SUSPECT_AFTER_S), "--lost-after", str(LOST_AFTER_S))
        # Restarts come quickly (a crash loop still backs off, up to 2 s).
        backoff = Backoff(base_s=0.2, cap_s=2.0, reset_after_s=10.0)
        self.fed = Federation(
            root, api_port=0, fleet=FLEET, hub_args=hub_args, store_url=store_url, backoff=backoff
        )
        self.links = {s.id: CuttableProxy("127.0.0.1", self.fed.nats.port) for s in FLEET}
        for spoke_id, link in self.links.items():
            self.fed.spoke_nats[spoke_id] = link.url
        self.runs_file = root / "runs.txt"
        self.seed = seed
        self.seconds = seconds
        self.faults = fault_schedule(seed, seconds)
        self.done: Counter[str] = Counter()  # faults injected, by kind
        self.skipped: Counter[str] = Counter()  # drawn but with nothing to hit (already down)
        self.accepted: dict[str, dict[str, Any]] = {}
        self.refused: Counter[str] = Counter()
        self.lock = asyncio.Lock()  # the supervisor and the faults never touch processes at once
        self.stopping = asyncio.Event()

    async def run(self) -> dict[str, Any]:
        for link in self.links.values():
            await link.start()
        await asyncio.to_thread(self.fed.start, 120.0, 2)
        supervisor = asyncio.create_task(self._supervise())
        submitter = asyncio.create_task(self._submit())
        try:
            await self._inject()
            self.stopping.set()
            await submitter
            for link in self.links.values():
                await link.cut()  # idempotent: then open again
                await link.restore()
            phases = await asyncio.to_thread(self._drain)
            return self._verdict(phases)
        finally:
            supervisor.cancel()
            await asyncio.gather(supervisor, return_exceptions=True)
            for link in self.links.values():  # its relays end here, not in the loop's close
                await link.close()

    def stop(self) -> None:
        self.fed.stop()

    # --- the three loops ---

    async def _supervise(self) -> None:
        while True:
            async with self.lock:
                for said in await asyncio.to_thread(self.fed.supervise):
                    print(f"chaos: {said}", file=sys.stderr, flush=True)
            await asyncio.sleep(0.1)

    async def _submit(self) -> None:
        rng = random.Random(self.seed + 1)
        client = HubClient(",".join(self.fed.api_urls), timeout_s=5.0, token=self.fed.admin_token)
        n = 0
        try:
            while not self.stopping.is_set():
                spec = workload_spec(rng, n, self.runs_file)
                n += 1
                try:
                    record = await asyncio.to_thread(client.submit, spec)
                    self.accepted[record["id"]] = spec
                except ApiError as exc:
                    # Unreachable or standing by: not accepted. Sent but no answer ("timeout"):
                    # perhaps accepted; not counted, its runs are still checked for overlaps.
                    self.refused[exc.code or _failure(exc)] += 1
                await asyncio.sleep(0.4)
        finally:
            client.close()

    async def _inject(self) -> None:
        start = time.monotonic()
        restores: list[asyncio.Task[None]] = []
        for fault in self.faults:
            await asyncio.sleep(max(0.0, start + fault.at_s - time.monotonic()))
            hit = await self._apply(fault, restores)
            (self.done if hit else self.skipped)[fault.kind] += 1
            if hit:
                print(f"chaos: {fault.at_s:7.2f}s {fault.kind} {fault.target}", file=sys.stderr)
        await asyncio.sleep(max(0.0, start + self.seconds - time.monotonic()))
        await asyncio.gather(*restores)

    async def _apply(self, fault: Fault, restores: list[asyncio.Task[None]]) -> bool:
        if fault.kind.startswith("cut"):
            link = self.links[fault.target]
            if link.is_cut:
                return False
            await link.cut()
            restores.append(asyncio.create_task(self._restore(link, fault.hold_s)))
            return True
        if fault.kind in ("kill_leader", "kill_standby"):
            roles = await asyncio.to_thread(self._roles)
            wanted = "leader" if fault.kind == "kill_leader" else "standby"
            name = next((n for n, role in roles.items() if role == wanted), None)
        else:
            name = fault.target or "nats"
        if name is None:
            return False
        async with self.lock:
            if name == "nats":
                if self.fed.nats.exited or self.fed.nats.pid is None:
                    return False
                os.kill(self.fed.nats.pid, signal.SIGKILL)  # alive (not reaped): its own pid
                return True
            proc = self.fed.procs.get(name)
            if proc is None or proc.poll() is not None:
                return False
            proc.kill()  # Popen: never a reused pid
            return True

    async def _restore(self, link: CuttableProxy, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await link.restore()

    def _roles(self) -> dict[str, str]:
        roles = {}
        for name, port in self.fed.hub_ports.items():
            client = HubClient(f"http://127.0.0.1:{port}", timeout_s=1.0)
            try:
                roles[name] = str(client.health().get("role", ""))
            except ApiError:
                roles[name] = ""
            finally:
                client.close()
        return roles

    # --- the end ---

    def _drain(self) -> dict[str, str]:
        """Each accepted workload's phase once all ended (or DRAIN_S passed); "" unknown."""
        client = HubClient(",".join(self.fed.api_urls), timeout_s=5.0, token=self.fed.admin_token)
        phases: dict[str, str] = {}
        deadline = time.monotonic() + DRAIN_S
        try:
            while True:
                for wid in self.accepted:
                    if phases.get(wid) in TERMINAL:
                        continue
                    try:
                        phases[wid] = client.workload(wid)["phase"]
                    except ApiError as exc:
                        phases[wid] = "" if exc.status == 404 else phases.get(wid, "unreachable")
                if all(p in TERMINAL or p == "" for p in phases.values()):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(1.0)
        finally:
            client.close()
        time.sleep(1.0)  # the last "end" lines
        return phases

    def _verdict(self, phases: dict[str, str]) -> dict[str, Any]:
        runs = read_runs(self.runs_file)
        overlapping = sum(1 for epochs in runs.values() if overlaps(epochs))  # accepted or not
        never = [w for w, spec in self.accepted.items() if spec["restart_policy"] == "never"]
        doubled = sum(1 for w in never if len(runs.get(w, {})) > 1)
        unfinished = sum(
            1
            for epochs in runs.values()
            for span in epochs.values()
            for _, end in span
            if end is None
        )
        result = {
            "minutes": round(self.seconds / 60, 2),
            "seed": self.seed,
            "faults": sum(self.done.values()),
            "faults_by_kind": dict(sorted(self.done.items())),
            "faults_skipped": dict(sorted(self.skipped.items())),
            "workloads": len(self.accepted),
            "phases": dict(Counter(p or "unknown" for p in phases.values())),
            "refused_submissions": dict(self.refused),
            "lost": sum(1 for p in phases.values() if p == ""),
            "stuck": sum(1 for p in phases.values() if p not in TERMINAL and p != ""),
            "overlapping_runs": overlapping,
            "doubled": doubled,
            "succeeded_unrun": sum(
                1 for w, p in phases.items() if p == "succeeded" and w not in runs
            ),
            "unfinished_runs": unfinished,
        }
        zero = ("lost", "stuck", "overlapping_runs", "doubled", "succeeded_unrun")
        result["ok"] = all(result[k] == 0 for k in zero)
        return result


def _failure(exc: ApiError) -> str:
    if exc.status:
        return str(exc.status)
    return "timeout" if str(exc).startswith("no answer") else "unreachable"


#: workload -> epoch -> [(start, end or None)] per node rank.
Runs = dict[str, dict[int, list[tuple[float, float | None]]]]


def read_runs(path: Path) -> Runs:
    """The runs as the workloads recorded them (start/end per workload, epoch, node rank)."""
    open_at: dict[tuple[str, int, int], float] = {}
    runs: Runs = defaultdict(lambda: defaultdict(list))
    if not path.exists():
        return {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 5:
            continue
        what, wid, epoch, rank, at = (
            parts[0],
            parts[1],
            int(parts[2]),
            int(parts[3]),
            float(parts[4]),
        )
        key = (wid, epoch, rank)
        if what == "start":
            open_at[key] = at
        elif key in open_at:
            runs[wid][epoch].append((open_at.pop(key), at))
    for (wid, epoch, _rank), at in open_at.items():
        runs[wid][epoch].append((at, None))
    return {w: dict(e) for w, e in runs.items()}


def overlaps(epochs: dict[int, list[tuple[float, float | None]]]) -> bool:
    """Whether runs of two different epochs of one workload were ever alive at once."""
    spans = [
        (epoch, start, float("inf") if end is None else end)
        for epoch, span in epochs.items()
        for start, end in span
    ]
    return any(
        a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the logs and the runs file")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gpufed-chaos-"))
    # Its own temp dir: the server runs as an unprivileged user under root, and `root` is 0700.
    postgres = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="gpufed-chaos-pg-")))
    soak: Soak | None = None
    try:
        postgres.start()
        url = postgres.url(postgres.create_database())
        soak = Soak(root / "fed", url, args.seed, args.minutes * 60)
        result = asyncio.run(soak.run())
    finally:
        if soak is not None:
            soak.stop()
        postgres.stop()
        shutil.rmtree(postgres.root, ignore_errors=True)
        if args.keep:
            print(f"chaos: logs in {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
