"""CPU cost of removing what ended workloads left on a spoke's disk, per workload.

Lays out `--count` ended workloads' files as the local runtime leaves them (a log, a workspace
folder, with `--files` files in it, and a load file when `--load`), in a temporary folder on the
file system of `--dir`, registers each as ended with a `spoke.runtime.leftovers.Leftovers` that
keeps none, and times one sweep: the process's user and system CPU (the event loop and the
worker thread that removes) and the wall time, per workload. Prints one JSON object (never
asserts a time). Creating the files is not timed.

Run: .venv/bin/python bench/leftovers.py [--count N] [--files F] [--load] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from gpufed import logs
from spoke.runtime.leftovers import Leftovers
from spoke.runtime.retention import Keep


async def _measure(root: Path, count: int, files: int, load: bool) -> dict[str, float | int]:
    log_dir, work_dir, load_dir = root / "logs", root / "work", root / "load"
    for folder in (log_dir, work_dir, load_dir):
        folder.mkdir()
    leftovers = Leftovers(Keep(seconds=3600, count=0), log_dir, work_dir, load_dir, dict)
    for n in range(count):
        wid = f"w{n:012x}"
        (log_dir / f"{wid}-e1.log").write_bytes(b"done\n")
        os.mkdir(work_dir / wid)
        for f in range(files):
            (work_dir / wid / f"out{f}").write_bytes(b"x")
        if load:
            (load_dir / f"{wid}.load").write_bytes(b"0.5\n")
        leftovers.ended(wid, 1)
    before, wall = os.times(), time.perf_counter()
    removed = await leftovers.sweep()
    after, wall = os.times(), time.perf_counter() - wall
    left = sum(1 for folder in (log_dir, work_dir, load_dir) for _ in folder.iterdir())
    return {
        "count": count,
        "removed": removed,
        "files_left": left,
        "files_per_workspace": files,
        "user_us_per_workload": round(1e6 * (after.user - before.user) / count, 1),
        "system_us_per_workload": round(1e6 * (after.system - before.system) / count, 1),
        "wall_us_per_workload": round(1e6 * wall / count, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--count", type=int, default=5000, help="ended workloads (5000)")
    p.add_argument("--files", type=int, default=0, help="files in each workspace (0)")
    p.add_argument("--load", action="store_true", help="each left a load file")
    p.add_argument("--dir", type=Path, default=None, help="where (the system's temp folder)")
    args = p.parse_args()
    logs.configure(level="warning")  # standard output carries the JSON only
    root = Path(tempfile.mkdtemp(prefix="gpufed-leftovers-", dir=args.dir))
    try:
        result = asyncio.run(_measure(root, args.count, args.files, args.load))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
