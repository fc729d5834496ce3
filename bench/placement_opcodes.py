"""`bench/placement.py`'s incremental cycles counted in Python opcodes, not milliseconds.

These machines run the same code 1.5-2x slower on some hours than on others, and a cycle's
time wanders by a tenth between two runs a minute apart: a change worth a few per cent cannot
be seen in `incremental_cycle_ms_*`. The number of Python opcodes the kept placement state
executes is the same on every run of one commit (the bench's world comes from a seeded
random generator, and the script runs itself again under PYTHONHASHSEED=0 so that sets of
names iterate in one order; `sys.settrace` with opcode events counts them, so the run is
~10x slower).
It does not weigh C work (dict lookups, sorting, allocation) or a Python call's overhead, so
it ranks changes to the Python of the core, not their exact worth in time. Prints one JSON
object:

- opcodes_cycles_1_29: opcodes of incremental cycles 1-29 (cycle 0, the first after the
  full plan, is left out: it reads every class of running work into victim order once);
- opcodes_cycle_1, opcodes_cycle_5: a deep-queue cycle (683 pending) and a shallower one;
- seed, iterations: what `bench/placement.py` ran with.

Run: .venv/bin/python bench/placement_opcodes.py [--seed S]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from types import FrameType
from typing import Any

import placement

from hub.core.planstate import PlanState

CYCLES = 30  # incremental cycles run; 1-29 are counted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    if os.environ.get("PYTHONHASHSEED") != "0":  # string hashes, and so set orders, fixed
        os.execve(
            sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONHASHSEED": "0"}
        )
    counts: list[int] = []
    count = 0

    def trace(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        frame.f_trace_opcodes = True
        count += 1
        return trace

    plan = PlanState.plan

    def counted(self: PlanState, *a: Any, **k: Any) -> Any:
        nonlocal count
        count = 0
        on = 2 <= len(counts) <= CYCLES  # 0: the full plan, 1: cycle 0, 2..30: cycles 1-29
        if on:
            sys.settrace(trace)
        try:
            return plan(self, *a, **k)
        finally:
            sys.settrace(None)
            counts.append(count if on else 0)

    PlanState.plan = counted  # type: ignore[method-assign]
    sys.argv = [sys.argv[0], "--iterations", str(CYCLES), "--seed", str(args.seed)]
    with contextlib.redirect_stdout(io.StringIO()):  # its timings mean nothing while traced
        placement.main()
    print(
        json.dumps(
            {
                "opcodes_cycles_1_29": sum(counts[2 : CYCLES + 1]),
                "opcodes_cycle_1": counts[2],
                "opcodes_cycle_5": counts[6],
                "seed": args.seed,
                "iterations": CYCLES,
            }
        )
    )


if __name__ == "__main__":
    main()
