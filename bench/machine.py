"""How fast this machine runs the hub's own Python right now: a figure to read others against.

These shared machines run the same code 1.5-2x slower on some hours than on others (the hub's
CPU per workload at 400/s measured 0.42 and 0.70 ms on the same commit, a day apart). A bench
that prints this beside its figures says which kind of hour they come from:
`machine_ref_us` is the CPU microseconds one workload record takes, in-process, through
submitted → placed → running → succeeded (`hub.transitions` on a `WorkloadRecord`: pydantic,
the pure lifecycle, the history), best of three rounds. No I/O, no threads.

    .venv/bin/python bench/machine.py      # prints {"machine_ref_us": ...}
"""

from __future__ import annotations

import json
import time

from hub import transitions
from hub.core.lifecycle import EndReason
from hub.records import WorkloadRecord
from schemas import Assignment, WorkloadSpec

_SPEC = WorkloadSpec.model_validate({"name": "bench", "team": "bench", "command": ["true"]})
_ON = (Assignment(node="n1", devices=(0,)),)


def _one(serial: int) -> None:
    record = WorkloadRecord(id=f"w{serial}", spec=_SPEC, submitted_at=1.0)
    record.note(1.0, "submitted")
    transitions.place(record, "eu-1", _ON, 2.0)
    transitions.start(record, 3.0)
    transitions.end(record, EndReason.SUCCEEDED, 4.0, "")


def reference_us(records: int = 5000, rounds: int = 3) -> float:
    """CPU µs per record's life in-process, the best of `rounds` (takes about 0.5 s)."""
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for serial in range(records):
            _one(serial)
        best = min(best, (time.process_time() - started) / records)
    return round(best * 1e6, 2)


if __name__ == "__main__":
    print(json.dumps({"machine_ref_us": reference_us()}))
