"""What observing a big federation costs the hub: one /metrics scrape, and a usage report.

A hub state of 100 spokes x 64 nodes x 8 GPUs (3 models), 20 teams with guarantees, 10,000
queued and 5,000 running workloads, 50 burst instance bills; and a history of 50,000 ended
workloads of 1-3 attempts each for the usage report. Prints one JSON object:

- scrape_ms_p50 / _p99: rendering the hub's whole /metrics exposition (state gauges are
  computed at scrape time) over 20 scrapes;
- exposition_bytes, series: its size;
- usage_report_ms: one `hub.usage.usage_report` over the history (what GET /v1/usage costs
  after the store has loaded the records);
- usage_attempts: attempts counted.

Run: .venv/bin/python bench/observability.py
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bus.client import Bus, BusSettings
from gpufed import logs
from hub import transitions
from hub.core.lifecycle import EndReason
from hub.core.policy import Policy, Quota, Team
from hub.records import SpokeRecord, WorkloadRecord
from hub.service import HubService
from hub.settings import HubSettings
from hub.store import Store
from hub.usage import InstanceBill, usage_report
from schemas import Assignment, CapacityReport, NodeCapacity, WorkloadSpec

MODELS = ("H100", "A100", "L4")
NOW = 1_800_000_000.0


def main() -> None:
    logs.configure(sys.stderr, json=False, level="warning")
    rng = random.Random(7)
    teams = [f"team-{i}" for i in range(20)]
    policy = Policy(
        teams=tuple(
            Team(t, quotas={m: Quota(guaranteed=16, limit=None) for m in MODELS}) for t in teams
        )
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.sqlite(Path(tmp) / "hub.db")
        hub = HubService(
            HubSettings(data_dir=Path(tmp)), store, Bus(BusSettings()), policy, clock=lambda: NOW
        )
        spokes = fill_fleet(hub, rng)
        fill_workloads(hub, rng, teams, spokes)
        for i in range(50):
            hub.bills[f"b{i}"] = InstanceBill(
                burst_id=f"b{i}", team=rng.choice(teams), spoke_id=f"b{i}", provider="aws",
                instance_type="p5.48xlarge", price_per_hour=98.0, requested_at=NOW - 7200,
                running_at=NOW - 6900, ended_at=None if i % 2 else NOW - 600,
            )  # fmt: skip
        times = []
        body = b""
        for _ in range(20):
            start = time.perf_counter()
            body = hub.metrics.exposition()
            times.append((time.perf_counter() - start) * 1000)
        history = make_history(rng, teams, spokes)
        start = time.perf_counter()
        report = usage_report(history, hub.spokes, hub.bills.values(), NOW, since=NOW - 86400)
        usage_ms = (time.perf_counter() - start) * 1000
        store.close()
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    print(
        json.dumps(
            {
                "scrape_ms_p50": round(statistics.median(times), 2),
                "scrape_ms_p99": round(max(times), 2),
                "exposition_bytes": len(body),
                "series": series,
                "usage_report_ms": round(usage_ms, 1),
                "usage_attempts": int(report["totals"]["attempts"]),
            }
        )
    )


def fill_fleet(hub: HubService, rng: random.Random) -> list[str]:
    ids = []
    for s in range(100):
        sid = f"spoke-{s}"
        model = MODELS[s % 3]
        nodes = tuple(
            NodeCapacity(
                name=f"{sid}-n{n}",
                gpu_model=model,
                gpu_count=8,
                free_devices=tuple(d for d in range(8) if rng.random() < 0.3),
            )
            for n in range(64)
        )
        report = CapacityReport(
            spoke_id=sid, region=f"r{s % 4}", incarnation="x", seq=1, nodes=nodes, sent_at=NOW
        )
        hub.spokes[sid] = SpokeRecord(
            id=sid, region=f"r{s % 4}", kind="onprem", first_seen=NOW - 3600,
            last_seen=NOW - rng.random() * 3, report=report,
        )  # fmt: skip
        hub.reports[sid] = report
        ids.append(sid)
    return ids


def fill_workloads(
    hub: HubService, rng: random.Random, teams: list[str], spokes: list[str]
) -> None:
    for i in range(15_000):
        w = WorkloadRecord(
            id=f"w{i}",
            spec=WorkloadSpec(
                name=f"w{i}", team=rng.choice(teams), gpus_per_node=rng.choice((1, 2, 4, 8)),
                priority_class=rng.choice(("batch", "dev", "training")), command=("true",),
            ),
            submitted_at=NOW - rng.random() * 7200,
        )  # fmt: skip
        if i >= 10_000:
            sid = rng.choice(spokes)
            node = f"{sid}-n{rng.randrange(64)}"
            devices = tuple(range(w.spec.gpus_per_node))
            transitions.place(w, sid, (Assignment(node=node, devices=devices),), NOW - 600)
            transitions.start(w, NOW - 590)
        else:
            w.reason = rng.choice(("insufficient_free", "quota_exceeded", "no_fitting_shape"))
        hub.workloads[w.id] = w


def make_history(rng: random.Random, teams: list[str], spokes: list[str]) -> list[WorkloadRecord]:
    out = []
    for i in range(50_000):
        w = WorkloadRecord(
            id=f"h{i}",
            spec=WorkloadSpec(
                name=f"h{i}", team=rng.choice(teams), gpus_per_node=rng.choice((1, 2, 4, 8)),
                command=("true",),
            ),
            submitted_at=NOW - 80_000,
            user=f"user-{rng.randrange(200)}",
        )  # fmt: skip
        t = NOW - rng.random() * 80_000
        for attempt in range(rng.choice((1, 1, 2, 3))):
            transitions.place(w, rng.choice(spokes), (), t)
            transitions.start(w, t + 5)
            t += 5 + rng.random() * 3600
            last = attempt == 2
            transitions.end(w, EndReason.SUCCEEDED if last else EndReason.PREEMPTED, t, "")
            if last:
                break
        out.append(w)
    return out


if __name__ == "__main__":
    main()
