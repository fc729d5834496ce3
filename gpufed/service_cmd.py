"""`gpufed service create|list|show|update|delete`: inference services (docs/services.md)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufed.client import ApiError, HubClient
from gpufed.flagnames import SERVICE_FLAGS, naming_the_flag
from gpufed.myteam import fill_team
from gpufed.yamlfile import read_mapping


def add_service_commands(sub: Any, command: Any) -> None:
    """Register `service`; `command` adds a client command (see gpufed.commands)."""
    service = command("service", "run inference services: replicas behind the gateway", _service)
    # The client flags again on each action, so they may also follow it (`service show X --json`).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--api", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    common.add_argument(
        "--token-file", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
    actions = service.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, help_text in (
        ("create", "create a service (a spec file and/or flags, then -- the replica command)"),
        ("update", "a new spec: a changed replica rolls the replicas over one at a time"),
    ):
        _spec_flags(actions.add_parser(name, help=help_text, parents=[common]))
    listing = actions.add_parser("list", help="services, replicas, load, cost", parents=[common])
    listing.add_argument("--team")
    for name, help_text in (
        ("show", "one service: replicas, ready, rps, cost per 1,000 requests"),
        ("delete", "delete a service; its replicas stop"),
    ):
        actions.add_parser(name, help=help_text, parents=[common]).add_argument(
            "target", metavar="TEAM/NAME"
        )


def _spec_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", type=Path, help="service spec as YAML or JSON")
    parser.add_argument("--name")
    parser.add_argument("--team", help="the team it serves (default: yours, if you have one)")
    parser.add_argument("--priority", dest="priority_class", help="default production")
    parser.add_argument("--min", type=int, dest="min_replicas", help="fewest replicas (0 allowed)")
    parser.add_argument("--max", type=int, dest="max_replicas", help="most replicas")
    parser.add_argument("--gpus", type=int, help="GPUs per replica")
    parser.add_argument("--fraction", type=float, dest="gpu_fraction", help="share of one GPU")
    parser.add_argument("--target-rps", type=float, help="requests per second per replica")
    parser.add_argument("--region", action="append", dest="regions", help="most preferred first")
    parser.add_argument("--health-path", help="HTTP path of the health check")
    parser.add_argument("--public", action="store_true", default=None, help="no token needed")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- replica program and args")


def _service(args: argparse.Namespace) -> int:
    client: HubClient = args.client
    if args.action == "list":
        return _list(args, client.services(args.team))
    if args.action in ("show", "delete"):
        team, name = _target(args)
        if args.action == "delete":
            client.delete_service(team, name)
            print(f"{team}/{name}: deleted; its replicas stop")
            return 0
        return _show(args, client.service(team, name))
    spec = _spec(args)
    if spec is None:
        return 1
    fill_team(spec, client)
    try:
        made = (
            client.create_service(spec) if args.action == "create" else client.update_service(spec)
        )
    except ApiError as exc:  # the hub names the spec's field: name the flag too
        raise naming_the_flag(exc, SERVICE_FLAGS) from None
    if args.json:
        print(json.dumps(made, indent=2))
        return 0
    print(f"{made['team']}/{made['name']}: generation {made['generation']}, at {made['url']}")
    return 0


def _spec(args: argparse.Namespace) -> dict[str, Any] | None:
    spec: dict[str, Any] = {}
    if args.file:
        try:
            spec = read_mapping(args.file)
        except ValueError as exc:
            print(f"gpufed: {exc}", file=sys.stderr)
            return None
    keys = ("name", "team", "priority_class", "min_replicas", "max_replicas", "regions", "public")
    for key in keys:
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    replica = dict(spec.get("replica") or {})
    command = [c for c in args.command if c != "--"] if args.command else []
    if command:
        replica["command"] = command
    if args.gpus is not None:
        replica["gpus"] = args.gpus
    if args.gpu_fraction is not None:
        replica["gpu_fraction"] = args.gpu_fraction
    if replica:
        spec["replica"] = replica
    if args.target_rps is not None:
        spec["autoscaling"] = {**(spec.get("autoscaling") or {}), "target": args.target_rps}
    if args.health_path:
        spec["health"] = {**(spec.get("health") or {}), "path": args.health_path}
    return spec


def _target(args: argparse.Namespace) -> tuple[str, str]:
    team, _, name = (args.target or "").partition("/")
    if not team or not name:
        raise SystemExit(f"gpufed: service {args.action} needs TEAM/NAME")
    return team, name


def _list(args: argparse.Namespace, services: list[dict[str, Any]]) -> int:
    if args.json:
        print(json.dumps(services, indent=2))
        return 0
    rows = [("SERVICE", "REPLICAS", "READY", "RPS", "REQUESTS", "$/1K REQ", "WHY")]
    for s in services:
        rows.append(
            (
                f"{s['team']}/{s['name']}",
                f"{len(s['replicas'])}/{s['desired']} ({s['spec']['min_replicas']}.."
                f"{s['spec']['max_replicas']})",
                str(s["ready"]),
                f"{s['rps']:.1f}",
                str(s["requests"]),
                _cost(s["cost_per_1k_requests"]),
                s["message"] or s["reason"],
            )
        )
    _table(rows)
    return 0


def _show(args: argparse.Namespace, s: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    spec = s["spec"]
    print(f"{s['team']}/{s['name']}  ({spec['priority_class']}, generation {s['generation']})")
    print(f"  url:       {s['url']}")
    print(
        f"  replicas:  {len(s['replicas'])} running or starting, {s['ready']} ready; "
        f"desired {s['desired']} ({s['reason']}), {spec['min_replicas']}..{spec['max_replicas']}"
    )
    scaling = spec["autoscaling"]
    print(
        f"  load:      {s['rps']:.2f} req/s, {s['in_flight']} in flight, {s['waiting']} waiting "
        f"(target {scaling['target']:g} {scaling['metric']} per replica)"
    )
    print(
        f"  cost:      {_count(s['requests'], 'request')}, {s['gpu_seconds']:.1f} GPU-s, "
        f"${s['cost_dollars']:.4f}; per 1,000 requests {_cost(s['cost_per_1k_requests'])}"
    )
    if s["message"]:
        print(f"  problem:   {s['message']}")
    rows = [("REPLICA", "GEN", "PHASE", "READY", "REQUESTS", "SPOKE", "URL")]
    for r in s["replicas"]:
        rows.append(
            (
                r["workload_id"],
                str(r["generation"]),
                "stopping" if r["stopping"] else r["phase"],
                "yes" if r["ready"] else "no",
                str(r["requests"]),
                r["spoke_id"] or "-",
                r["endpoint"] or "-",
            )
        )
    _table(rows)
    t0 = s["created_at"]
    print("  recent:")
    for h in s["history"][-8:]:
        print(f"    +{h['at'] - t0:8.1f}s  {h['event']}  {h['detail']}")
    return 0


def _cost(value: float | None) -> str:
    return "-" if value is None else f"${value:.4f}"


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _count(n: int, noun: str) -> str:
    """`1 request`, `2 requests`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
