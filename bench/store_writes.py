"""CPU cost of the hub's store writes per workload, without NATS or spokes.

Drives a real `HubState` and `Store` (SQLite in a temporary folder, or `--store-url`) through
what the hub writes for each workload, in batches of `--batch` as under load: its submission
(record and audit entry, through `Submissions`), its placement (record with its new attempt,
and the Place decision, published through `Publisher` to a bus that acks at once, then marked
published), its start and its end. The next batch's submission is saved while one batch runs
through, as submissions arrive while the hub places and hears events. Prints one JSON object
(never asserts a time): CPU milliseconds per workload of the whole process
(`time.process_time()`) and of its threads (psutil: the event loop's and the others', where
store calls run), and the store calls made per workload. The hub's checkpoints of the
SQLite log (`hub.checkpoints`, every second beside the writer) run meanwhile and are counted.
With `--earlier K` each workload comes with K ended attempts and their history (five entries
each), as one preempted K times before (every save of it once rewrote all of its attempts,
and serialised all of its history again).

Run: .venv/bin/python bench/store_writes.py [--count N] [--batch B] [--earlier K] [--store-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from gpufed import logs
from hub import transitions
from hub.authstore import AuditEntry
from hub.checkpoints import checkpoints
from hub.core.lifecycle import Attempt, EndReason
from hub.ids import decision_id, new_workload_id
from hub.publishing import Publisher
from hub.records import DecisionRecord, HistoryEntry, WorkloadRecord
from hub.settings import HubSettings
from hub.state import HubState
from hub.store import Store
from hub.submissions import Submissions
from schemas import Assignment, WorkloadSpec

sys.path.insert(0, str(Path(__file__).parent))
# The same stand-in bus as the cycle's bench.
from hub_cycle import NullBus

SPEC = WorkloadSpec.model_validate(
    {"name": "bench", "team": "bench", "command": ["python", "train.py", "--epochs", "3"]}
)
#: What an earlier attempt held (`--earlier`), and what its history says.
HELD = (Assignment(node="n0", devices=(0,)),)
EARLIER_HISTORY = (
    ("placed", "n0:0"),
    ("running", ""),
    ("preempting", "for a higher class"),
    ("preempted", "preempted for a higher class"),
    ("requeued", ""),
)


class Counting:
    """The store, counting the calls made to it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return attr(*args, **kwargs)

        setattr(self, name, counted)  # the same method each time (as a bound method compares)
        return counted


def thread_cpu() -> tuple[float, float]:
    """CPU seconds of this process's main thread and of its other threads."""
    main_id = threading.main_thread().native_id
    main = other = 0.0
    for t in psutil.Process().threads():
        if t.id == main_id:
            main += t.user_time + t.system_time
        else:
            other += t.user_time + t.system_time
    return main, other


async def submit(
    submissions: Submissions, batch: int, now: float, earlier: int = 0
) -> list[WorkloadRecord]:
    """A batch of submissions, saved with their audit entries (as over NATS); each with
    `earlier` ended attempts (preempted before, queued again) and their history."""
    records = [
        WorkloadRecord(id=new_workload_id(), spec=SPEC, submitted_at=now) for _ in range(batch)
    ]
    for r in records:
        r.attempts = tuple(
            Attempt(epoch, "eu-2", HELD, now, now, now, EndReason.PREEMPTED)
            for epoch in range(1, earlier + 1)
        )
        r.history = [
            HistoryEntry(now, event, epoch, "eu-2", detail)
            for epoch in range(1, earlier + 1)
            for event, detail in EARLIER_HISTORY
        ]
    audits = [
        AuditEntry(
            at=now,
            actor="bench",
            role="submitter",
            action="submit",
            team="bench",
            target=r.id,
            result="ok",
        )
        for r in records
    ]
    await submissions.commit(records, audits)
    return records


async def run_through(
    state: HubState, publisher: Publisher, records: list[WorkloadRecord], now: float
) -> None:
    """Submitted workloads through placement, start and end (as the cycle and events do)."""
    decisions = []
    async with state.lock:
        for i, r in enumerate(records):
            transitions.place(r, "eu-1", (Assignment(node=f"n{i % 8}", devices=(i % 8,)),), now)
            decisions.append(
                DecisionRecord(
                    decision_id=decision_id(r.id, r.epoch, "place"),
                    workload_id=r.id,
                    spoke_id="eu-1",
                    subject="spoke.eu-1.commands",
                    payload=b"x" * 600,
                    created_at=now,
                )
            )
        await state.save(records, decisions)
    await publisher.publish(decisions)
    async with state.lock:
        for r in records:
            transitions.start(r, now)
        await state.save(records)
    async with state.lock:
        for r in records:
            transitions.end(r, EndReason.SUCCEEDED, now, "exit 0", 0)
        await state.save(records)
        for r in records:
            state.forget(r.id)


async def batches(
    state: HubState, publisher: Publisher, batch: int, count: int, now: float, earlier: int
) -> None:
    """`count` batches; each batch's submission is saved while the one before runs through."""
    submissions = Submissions(state)
    previous = await submit(submissions, batch, now, earlier)
    for _ in range(count):
        previous, _ = await asyncio.gather(
            submit(submissions, batch, now, earlier), run_through(state, publisher, previous, now)
        )
    await run_through(state, publisher, previous, now)


async def run(url: str, count: int, batch: int, earlier: int) -> dict[str, Any]:
    store = Counting(Store(url))
    state = HubState(HubSettings(), store, time.time, policy=None)  # type: ignore[arg-type]
    publisher = Publisher(state, NullBus())  # type: ignore[arg-type]
    now = time.time()
    # Warm up: statements compiled, pool filled.
    await batches(state, publisher, batch, 1, now, earlier)
    await publisher.flush_marks()
    store.calls.clear()
    # The hub's checkpoints beside the writer (`hub.checkpoints`), counted with the rest.
    stop = asyncio.Event()
    checkpointing = asyncio.create_task(checkpoints(state, stop))
    cpu, (main, other) = time.process_time(), thread_cpu()
    await batches(state, publisher, batch, count // batch - 1, now, earlier)
    await publisher.flush_marks()
    stop.set()
    await checkpointing
    cpu, (main2, other2) = time.process_time() - cpu, thread_cpu()
    store.store.close()
    done = count // batch * batch
    return {
        "count": done,
        "batch": batch,
        "earlier_attempts": earlier,
        "cpu_ms_per_workload": round(cpu * 1000 / done, 4),
        "loop_thread_cpu_ms_per_workload": round((main2 - main) * 1000 / done, 4),
        "other_threads_cpu_ms_per_workload": round((other2 - other) * 1000 / done, 4),
        "store_calls_per_workload": {k: round(v / done, 3) for k, v in store.calls.items()},
    }


def main() -> None:
    logs.configure(sys.stderr, json=False, level="warning")
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument(
        "--earlier", type=int, default=0, help="ended attempts (with their history) per workload"
    )
    parser.add_argument("--store-url", default=None, help="SQLAlchemy URL (default: SQLite)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store_url or f"sqlite:///{Path(tmp) / 'hub.db'}"
        result = asyncio.run(run(url, args.count, args.batch, args.earlier))
    result["load_average_1m"] = round(__import__("os").getloadavg()[0], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
