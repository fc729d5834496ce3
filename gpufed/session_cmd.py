"""`gpufed session open|list|close`: interactive sessions (notebooks, shells) with a URL.

`open` submits a workload of kind `session` (class `dev` unless --priority says otherwise),
waits until it runs and its URL accepts a TCP connection, and prints the URL alone on the last
line of stdout (progress goes to stderr), so `URL=$(gpufed session open ...)` works.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gpufed.client import ApiError
from gpufed.flagnames import SESSION_FLAGS, naming_the_flag
from gpufed.myteam import fill_team

TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE = "queued,placed,running"
POLL_S = 0.25


def add_session_commands(sub: Any, command: Any) -> None:
    """Register `session open|list|close`; `command` adds a client command (gpufed.commands)."""
    session = command("session", "open, list or close interactive sessions (with a URL)", _session)
    # The client options again on each action, so they may follow it (`session open --api X`).
    options = argparse.ArgumentParser(add_help=False)
    options.add_argument("--api", default=None, help="hub URL (default $GPUFED_API or :8080)")
    options.add_argument("--token-file", type=Path, default=None, help="bearer token file")
    options.add_argument("--json", action="store_true", help="print JSON")
    actions = session.add_subparsers(dest="action", required=True, metavar="ACTION")
    opened = actions.add_parser(
        "open", parents=[options], help="start a session; print its URL once it answers"
    )
    opened.add_argument("--team", help="the team it runs for (default: yours, if you have one)")
    opened.add_argument("--name", default="session")
    opened.add_argument(
        "--gpus", type=float, default=1.0, help="GPUs: a share of one (0.5) or a whole number"
    )
    opened.add_argument("--gpu-model", action="append", dest="gpu_models")
    opened.add_argument("--priority", dest="priority_class", help="class (default dev)")
    opened.add_argument("--region", action="append", dest="regions", help="required region")
    opened.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for it")
    opened.add_argument(
        "--no-connect",
        action="store_true",
        help="print the URL once it runs, without checking it accepts connections from here "
        "(a Kubernetes Service URL resolves inside the cluster only)",
    )
    opened.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")
    listed = actions.add_parser("list", parents=[options], help="sessions not ended yet")
    listed.add_argument("--team")
    closed = actions.add_parser("close", parents=[options], help="stop a session")
    closed.add_argument("id")


def _session(args: argparse.Namespace) -> int:
    if args.action == "open":
        return _open(args)
    if args.action == "list":
        return _list(args)
    kind = args.client.workload(args.id)["spec"].get("kind", "job")
    if kind != "session":  # a mistyped id must not stop someone's training run
        print(
            f"gpufed session close: {args.id} is a {kind}, not a session "
            f"(`gpufed cancel {args.id}` stops it)",
            file=sys.stderr,
        )
        return 1
    r = args.client.cancel(args.id)
    print(f"{r['id']}: {'closed' if r['phase'] in TERMINAL else 'closing'}")
    return 0


def session_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The WorkloadSpec fields `session open` submits."""
    command = [c for c in args.command or () if c != "--"]
    spec: dict[str, Any] = {"name": args.name, "team": args.team, "kind": "session"}
    spec["command"] = command
    if 0 < args.gpus < 1:
        spec["gpu_fraction"] = args.gpus
    else:
        spec["gpus_per_node"] = int(args.gpus) if float(args.gpus).is_integer() else args.gpus
    if args.priority_class:
        spec["priority_class"] = args.priority_class
    if args.gpu_models:
        spec["gpu_models"] = args.gpu_models
    if args.regions:
        spec["affinity"] = {"required_regions": args.regions}
    return spec


def _open(args: argparse.Namespace) -> int:
    spec = session_spec(args)
    if not spec["command"]:
        print("gpufed session open: give -- the command to run", file=sys.stderr)
        return 2
    fill_team(spec, args.client)
    try:
        record = args.client.submit(spec)
    except ApiError as exc:  # the hub names the spec's field: name the flag too
        raise naming_the_flag(exc, SESSION_FLAGS) from None
    wid = record["id"]
    print(f"session {wid} submitted; waiting for its URL", file=sys.stderr)
    deadline = time.monotonic() + args.timeout
    said = ""
    while time.monotonic() < deadline:
        record = args.client.workload(wid)
        phase, url = record["phase"], record.get("endpoint")
        if phase in TERMINAL:
            why = record.get("message") or record.get("reason") or phase
            print(f"gpufed session open: {wid} ended {phase}: {why}", file=sys.stderr)
            return 1
        status = f"{phase}: {record.get('message') or ''}".rstrip(": ")
        if status != said:
            print(f"  {status}", file=sys.stderr)
            said = status
        if phase == "running" and url and (args.no_connect or reachable(url)):
            if args.json:
                print(json.dumps(record, indent=2))
            print(url)
            return 0
        time.sleep(POLL_S)
    # Say where it is (a session still queued for GPUs is not "running"), and that it stays.
    print(
        f"gpufed session open: {wid} has no reachable URL after {args.timeout:g} s; it is "
        f"still {said or record['phase']} (`gpufed session close {wid}` to stop it)",
        file=sys.stderr,
    )
    return 1


def reachable(url: str, timeout_s: float = 1.0, settle_s: float = 0.3) -> bool:
    """Whether the session's own server takes a connection at the URL now.

    A connection that succeeds is not enough: the spoke's relay (spoke/relay.py) accepts from
    the start and closes a connection at once while the workload's port refuses it. So the
    connection must also stay open for `settle_s` or bring bytes (a banner, or the server's
    answer to nothing): an end of stream within it means nobody is behind it yet.
    """
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s) as conn:
            conn.settimeout(settle_s)
            try:
                return conn.recv(1) != b""
            except TimeoutError:
                return True  # open and quiet: a server waiting for its client to speak
    except OSError:
        return False


def _list(args: argparse.Namespace) -> int:
    records = [
        r
        for r in args.client.workloads(team=args.team, phase=ACTIVE)
        if r["spec"].get("kind") == "session"
    ]
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    now = time.time()
    rows = [("ID", "NAME", "TEAM", "GPUS", "PHASE", "AGE", "IDLE", "URL")]
    for r in records:
        spec = r["spec"]
        gpus = spec.get("gpu_fraction") or spec["gpus_per_node"]
        started = r.get("started_at")
        rows.append(
            (
                r["id"],
                spec["name"],
                spec["team"],
                f"{gpus:g}",
                r["phase"],
                age(now - started) if started else "-",
                age(r["idle_s"]) if r.get("idle_s") is not None else "-",
                r.get("endpoint") or "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return 0


def age(seconds: float) -> str:
    s = int(max(0.0, seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
