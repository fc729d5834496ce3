"""`gpufed burst`: run the cloud burst controller with the local or the AWS provider.

`gpufed.cli` adds the subcommand with `add_burst_parser(sub)`; `python -m gpufed.burst_entry`
runs it on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from burst.errors import BurstError
from burst.settings import BurstSettings, TeamBudgetSettings
from gpufed import logs
from gpufed.cliflags import check_nats_files
from gpufed.compose.burst import build_burst, serve_burst
from gpufed.secretfile import read_secret_file
from gpufed.settings_errors import refused_settings

#: argparse dest -> BurstSettings field, for flags whose names differ from the field.
_RENAMED = {
    "tick": "tick_s",
    "burst_after": "burst_after_s",
    "idle_ttl": "idle_ttl_s",
    "cooldown": "cooldown_s",
    "capacity_backoff": "capacity_backoff_s",
    "boot_timeout": "boot_timeout_s",
    "demand_stale": "demand_stale_s",
    "wait_per_gpu": "wait_per_gpu_s",
    "reconcile_every": "reconcile_s",
    "orphan_grace": "orphan_grace_s",
    "launch_grace": "launch_grace_s",
    "spoke_silent": "spoke_silent_s",
    "spoke_heartbeat": "spoke_heartbeat_s",
    "stop_grace": "local_stop_grace_s",
    "allow_team": "allowed_teams",
    "credential_ttl": "instance_credential_ttl_s",
    "region": "regions",
    "aws_subnet": "aws_subnet_ids",
    "aws_security_group": "aws_security_group_ids",
}
_NOT_SETTINGS = {"func", "parser", "team_budget", "unlimited_instances", "nats_url_file"}


def add_burst_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `burst` to the `gpufed` subcommands. Unset flags keep BurstSettings' defaults."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "burst", help="run the cloud burst controller (launches and releases cloud spokes)"
    )
    p.add_argument("--nats-url", help="hub NATS URL (default nats://127.0.0.1:4222)")
    p.add_argument(
        "--nats-url-file", type=Path, help="a file holding the NATS URL (a mounted Secret)"
    )
    p.add_argument("--nats-creds", type=Path, help="this controller's NATS .creds file")
    p.add_argument("--nats-ca", type=Path, help="CA of the NATS server's certificate (TLS)")
    p.add_argument(
        "--nats-issuer",
        type=Path,
        help="issuer file: mint and revoke a NATS credential per cloud instance",
    )
    p.add_argument("--credential-ttl", type=int, help="s an instance credential lives (43200)")
    p.add_argument("--provider", choices=["local", "aws"], help="default local")
    p.add_argument("--tick", type=float, help="s between planning rounds (2)")
    p.add_argument("--id-prefix", help="start of burst ids; stable per deployment (burst)")
    p.add_argument("--catalog", type=Path, help="instance catalog YAML (default: shipped one)")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    p.add_argument("--metrics-host", help="address of the metrics server (127.0.0.1)")

    policy = p.add_argument_group("policy (times in seconds)")
    policy.add_argument("--burst-after", type=float, help="demand age before bursting (60)")
    policy.add_argument("--idle-ttl", type=float, help="idle time before release (300)")
    policy.add_argument("--cooldown", type=float, help="per team, between launch/release (120)")
    policy.add_argument("--capacity-backoff", type=float, help="offer blocked after error (180)")
    policy.add_argument("--boot-timeout", type=float, help="spoke must join within (1200)")
    policy.add_argument("--demand-stale", type=float, help="ignore older demand reports (120)")
    policy.add_argument("--max-instances", type=int, help="live instances at most (10)")
    policy.add_argument(
        "--unlimited-instances", action="store_true", help="no cap on live instances"
    )
    policy.add_argument("--max-dollars-per-hour", type=float, help="$/h of all live instances")
    policy.add_argument(
        "--allow-team", action="append", metavar="TEAM", help="teams that may burst (default all)"
    )
    policy.add_argument(
        "--team-budget",
        action="append",
        default=[],
        metavar="TEAM=PER_HOUR[,TOTAL]",
        help="a team's $/h over its live instances and/or total $ (e.g. ml=50, ml=,200)",
    )
    policy.add_argument("--markets", choices=["spot_first", "on_demand_only"])
    policy.add_argument("--wait-per-gpu", type=float, help="more demand age per GPU asked (0)")
    policy.add_argument(
        "--right-size",
        action=argparse.BooleanOptionalAction,
        help="an instance per workload instead of packing (on)",
    )
    policy.add_argument(
        "--burst-restarted",
        action=argparse.BooleanOptionalAction,
        help="burst work that ran before and was preempted (off)",
    )
    policy.add_argument("--region", action="append", metavar="REGION", help="allowed regions")

    loop = p.add_argument_group("housekeeping (seconds)")
    loop.add_argument("--reconcile-every", type=float, help="re-check with the provider (30)")
    loop.add_argument("--orphan-grace", type=float, help="age before unknown ones go (300)")
    loop.add_argument("--launch-grace", type=float, help="requested but unseen: failed (60)")
    loop.add_argument("--spoke-silent", type=float, help="silent spoke counts as idle (120)")

    local = p.add_argument_group("local provider (cloud spokes as local processes)")
    local.add_argument("--state-dir", type=Path, help="state, inventories, logs (.gpufed/burst)")
    local.add_argument("--python", help="Python that runs the spokes (this one)")
    local.add_argument("--spoke-nats-url", help="NATS URL the spokes dial (default --nats-url)")
    local.add_argument("--spoke-heartbeat", type=float, help="spoke heartbeat s (1)")
    local.add_argument("--stop-grace", type=float, help="SIGTERM to SIGKILL s (15)")

    aws = p.add_argument_group("aws provider (one region)")
    aws.add_argument("--aws-region")
    aws.add_argument("--aws-image-id", help="AMI with Python 3.11+ and NVIDIA drivers")
    aws.add_argument("--aws-subnet", action="append", help="tried in order (repeat)")
    aws.add_argument("--aws-security-group", action="append")
    aws.add_argument("--aws-instance-profile")
    aws.add_argument("--aws-key-name")
    aws.add_argument("--aws-cluster", help="this deployment's tag; the orphan sweep keeps to it")
    aws.add_argument("--aws-package", help="pip requirement the instance installs")
    aws.add_argument("--aws-root-volume-gib", type=int)
    aws.add_argument("--aws-root-device-name")
    aws.add_argument("--aws-endpoint-url", help="EC2 endpoint (tests, proxies)")
    aws.add_argument("--aws-profile")
    p.set_defaults(func=run_burst, parser=p)
    return p


def settings_from_args(args: argparse.Namespace) -> BurstSettings:
    """BurstSettings from parsed flags (raises ValidationError / ValueError on bad values)."""
    values: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if dest in _NOT_SETTINGS or value is None:
            continue
        values[_RENAMED.get(dest, dest)] = value
    url_file = getattr(args, "nats_url_file", None)
    if url_file is not None:
        values["nats_url"] = read_secret_file(url_file, "--nats-url-file")
    if getattr(args, "unlimited_instances", False):
        values["max_instances"] = None
    budgets = [_team_budget(item) for item in getattr(args, "team_budget", [])]
    if budgets:
        values["team_budgets"] = dict(budgets)
    return BurstSettings.model_validate(values)


def run_burst(args: argparse.Namespace) -> int:
    """The `gpufed burst` handler: configure logs, build the controller, run until stopped."""
    logs.configure()
    try:
        check_nats_files(args)
        controller = build_burst(settings_from_args(args))
    except ValidationError as exc:  # a setting refused: named by its flag
        flags = {field: dest for dest, field in _RENAMED.items()}
        print(f"gpufed burst: {refused_settings(exc, args.parser, flags)}", file=sys.stderr)
        return 1
    except (BurstError, ValueError) as exc:
        print(f"gpufed burst: {exc}", file=sys.stderr)
        return 1
    asyncio.run(serve_burst(controller))
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m gpufed.burst_entry ...`: the `gpufed burst` subcommand on its own."""
    parser = argparse.ArgumentParser(prog="gpufed")
    add_burst_parser(parser.add_subparsers(metavar="COMMAND"))
    args = parser.parse_args(["burst", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args) or 0)


def _team_budget(item: str) -> tuple[str, TeamBudgetSettings]:
    team, sep, limits = item.partition("=")
    rate, _, total = limits.partition(",")
    if not sep or not team:
        raise ValueError(f"--team-budget wants TEAM=PER_HOUR[,TOTAL], got {item!r}")
    try:
        return team, TeamBudgetSettings(
            dollars_per_hour=float(rate) if rate else None,
            dollars_total=float(total) if total else None,
        )
    except ValueError as exc:
        raise ValueError(f"--team-budget {item!r}: {exc}") from exc


if __name__ == "__main__":
    raise SystemExit(main())
