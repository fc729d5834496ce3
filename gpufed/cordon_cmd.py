"""`gpufed cordon`, `uncordon` and `drain`: an operator takes a spoke out of placement, and
with `drain` moves the work it runs that may move (`hub.cordons`). Admin only."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_cordon_commands(command: Any) -> None:
    """Register `cordon`, `uncordon` and `drain`; `command` adds a client command (see
    commands)."""
    cordon = command(
        "cordon", "take a spoke out of placement: no new work; what runs there runs on", _cordon
    )
    cordon.add_argument("spoke")
    cordon.add_argument("--reason", default="", help="shown with the spoke (gpufed spokes)")
    command("uncordon", "put a cordoned spoke back into placement", _uncordon).add_argument("spoke")
    drain = command(
        "drain",
        "cordon a spoke and move its work elsewhere (what may not move runs on, listed)",
        _drain,
    )
    drain.add_argument("spoke")
    drain.add_argument(
        "--reason", default="", help="shown with the spoke and in each job's history"
    )


def _cordon(args: argparse.Namespace) -> int:
    s = args.client.cordon(args.spoke, args.reason)
    print(
        f"spoke {s['id']} cordoned: no new work goes there; {s['running']} running "
        "workload(s) run on (gpufed uncordon to put it back)"
    )
    return 0


def _uncordon(args: argparse.Namespace) -> int:
    s = args.client.uncordon(args.spoke)
    print(f"spoke {s['id']} back in placement")
    return 0


def _drain(args: argparse.Namespace) -> int:
    drained = args.client.drain(args.spoke, args.reason)
    if args.json:
        print(json.dumps(drained, indent=2))
        return 0
    spoke, moved, left = drained["spoke"]["id"], drained["requeued"], drained["left_running"]
    print(
        f"spoke {spoke} cordoned and drained: {len(moved)} workload(s) stop there (with their "
        "grace) and queue again for elsewhere (gpufed uncordon to put it back)"
    )
    for w in moved:
        print(f"  moved  {w['workload_id']}  {w['team']}/{w['name']}")
    if left:
        print(f"{len(left)} workload(s) run on there (cancel them, or wait for them to end):")
    for w in left:
        print(f"  stays  {w['workload_id']}  {w['team']}/{w['name']}  ({w['why']})")
    return 0
