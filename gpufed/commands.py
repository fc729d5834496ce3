"""CLI commands that talk to a running hub: submit, jobs, explain, cancel, spokes, policy,
usage, logs, top."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from gpufed.client import STORE_UNAVAILABLE, ApiError, HubClient
from gpufed.cordon_cmd import add_cordon_commands
from gpufed.flagnames import SUBMIT_FLAGS, naming_the_flag
from gpufed.myteam import TeamNotGiven, fill_team
from gpufed.policy_check import overlapping_windows, unknown_models
from gpufed.policy_view import policy_in_force
from gpufed.session_cmd import age
from gpufed.top import spoke_status
from gpufed.when import parse_duration, parse_when
from gpufed.yamlfile import read_mapping
from schemas.events import without_log_path


def add_client_commands(sub: Any) -> None:
    def command(name: str, help_text: str, func: Callable[[argparse.Namespace], int]) -> Any:
        parser = sub.add_parser(name, help=help_text)
        parser.add_argument("--api", default=None, help="hub URL (default $GPUFED_API or :8080)")
        parser.add_argument(
            "--token-file",
            type=Path,
            default=None,
            help="file holding the bearer token (default $GPUFED_TOKEN, $GPUFED_TOKEN_FILE, "
            "else .gpufed/admin.token when it exists)",
        )
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(func=_guarded(func))
        return parser

    submit = command("submit", "submit a workload", _submit)
    submit.add_argument("-f", "--file", type=Path, help="workload spec as YAML or JSON")
    submit.add_argument("--name")
    submit.add_argument("--team", help="the team it runs for (default: yours, if you have one)")
    submit.add_argument("--priority", dest="priority_class")
    submit.add_argument(
        "--kind", choices=["job", "session", "service"], help="session/service: gets a URL"
    )
    submit.add_argument("--gpus", type=int, dest="gpus_per_node", help="GPUs per node")
    submit.add_argument("--nodes", type=int)
    submit.add_argument("--gpu-model", action="append", dest="gpu_models")
    submit.add_argument("--fraction", type=float, dest="gpu_fraction")
    submit.add_argument("--region", action="append", dest="regions", help="required region")
    submit.add_argument("--env", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument(
        "--secret-env",
        action="append",
        default=[],
        metavar="KEY",
        help="an environment variable of this shell passed on as a secret: never shown back",
    )
    submit.add_argument(
        "--max-runtime",
        type=_seconds,
        dest="max_runtime_s",
        help="stopped after this long: seconds, 90m, 12h, 2d",
    )
    submit.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="taken at most once under KEY, however often sent (default: a new one, printed "
        "if no hub answered)",
    )
    submit.add_argument("command", nargs=argparse.REMAINDER, help="-- program and arguments")

    jobs = command("jobs", "list workloads", _jobs)
    jobs.add_argument("--team")
    jobs.add_argument("--phase", help="comma-separated phases")
    jobs.add_argument("--limit", type=int, default=50)

    explain = command("explain", "show a workload and why it waits", _explain)
    explain.add_argument("id")

    cancel = command("cancel", "cancel a workload", _cancel)
    cancel.add_argument("id")

    command("spokes", "list spokes and their GPUs", _spokes)
    add_cordon_commands(command)

    policy = command("policy", "show the policy in force, or set a new one (admin)", _policy)
    policy.add_argument("action", choices=["show", "set"])
    policy.add_argument("file", nargs="?", type=Path, help="policy YAML (for set)")
    policy.add_argument(
        "--at",
        default=None,
        metavar="TIME",
        help="show: the policy in force at TIME (now, ISO 8601, epoch s), time windows applied",
    )

    usage = command("usage", "GPU-hours and cloud cost per team, user or spoke", _usage)
    usage.add_argument(
        "--since", default=None, help="unix time, ISO date/time, or an age like 2h or 7d (all)"
    )
    usage.add_argument("--until", default=None, help="same forms (default: now)")
    usage.add_argument("--by", choices=["team", "user", "spoke"], default="team")
    usage.add_argument("--csv", action="store_true", help="print CSV")

    logs = command("logs", "print a workload's log from its spoke", _logs)
    logs.add_argument("id")
    logs.add_argument("-f", "--follow", action="store_true", help="follow until it ends")
    logs.add_argument("--bytes", type=int, default=65536, help="how much of the tail (64 KiB)")

    top = command("top", "live view of the fleet and the queue (Ctrl-C quits)", _top)
    top.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes")
    top.add_argument("--once", action="store_true", help="print one frame and exit")

    from gpufed.service_cmd import add_service_commands
    from gpufed.session_cmd import add_session_commands
    from gpufed.token_cmd import add_token_commands

    add_token_commands(sub, command)
    add_session_commands(sub, command)
    add_service_commands(sub, command)


def _seconds(text: str) -> int:
    """A length of time a person types (`gpufed.when.parse_duration`), in whole seconds."""
    try:
        return math.ceil(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        token = None
        if args.token_file is not None:
            try:
                token = args.token_file.read_text().strip()
            except OSError as exc:
                print(f"gpufed: cannot read --token-file: {exc}", file=sys.stderr)
                return 1
        client = HubClient(
            args.api, token=token, say=lambda text: print(f"gpufed: {text}", file=sys.stderr)
        )
        args.client = client
        try:
            return func(args)
        except ApiError as exc:
            code = f" [{exc.code}]" if exc.code else ""
            print(f"gpufed: {exc}{code}", file=sys.stderr)
            return 1
        except TeamNotGiven as exc:  # what to type: a usage error
            print(f"gpufed: {exc}", file=sys.stderr)
            return 2
        finally:
            client.close()

    return run


def _submit(args: argparse.Namespace) -> int:
    spec: dict[str, Any] = {}
    if args.file:
        try:
            spec = read_mapping(args.file)
        except ValueError as exc:
            print(f"gpufed: {exc}", file=sys.stderr)
            return 1
    for key in ("name", "team", "kind", "priority_class", "gpus_per_node", "nodes", "gpu_models"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if args.gpu_fraction is not None:
        spec["gpu_fraction"] = args.gpu_fraction
    if args.max_runtime_s is not None:
        spec["max_runtime_s"] = args.max_runtime_s
    if args.regions:
        spec.setdefault("affinity", {})["required_regions"] = args.regions
    if args.env:
        spec.setdefault("env", {}).update(dict(e.split("=", 1) for e in args.env if "=" in e))
    for key in args.secret_env:
        # The value comes from this shell, never from argv, where other users could read it.
        if key not in os.environ:
            print(f"gpufed: --secret-env {key}: not set in this environment", file=sys.stderr)
            return 1
        spec.setdefault("env", {})[key] = {"value": os.environ[key], "secret": True}
    command = [c for c in args.command if c != "--"] if args.command else []
    if command:
        spec["command"] = command
    fill_team(spec, args.client)
    key = args.idempotency_key or str(uuid.uuid4())  # sent again under it until a hub answers
    again = f"It may have been taken: the same command with `--idempotency-key {key}` takes it"
    try:
        record = args.client.submit(spec, key)
    except KeyboardInterrupt:  # (Ctrl-C while it waited for a hub)
        print(f"gpufed: stopped. {again} at most once.", file=sys.stderr)
        return 130
    except ApiError as exc:  # the hub names the spec's field: name the flag too
        if not exc.status or exc.code == STORE_UNAVAILABLE:  # the key says if it was taken
            raise ApiError(f"{exc} {again} at most once.") from None
        raise naming_the_flag(exc, SUBMIT_FLAGS) from None
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print(record["id"])
    return 0


def _jobs(args: argparse.Namespace) -> int:
    records = args.client.workloads(team=args.team, phase=args.phase, limit=args.limit)
    if args.json:
        print(json.dumps(records, indent=2))
        return 0
    if not records:
        print(_none_listed(args), file=sys.stderr)
        return 0
    head = ("ID", "NAME", "TEAM", "CLASS", "PRIO", "POS", "GPUS", "PHASE", "SPOKE", "WAIT")
    rows = [(*head, "RUN", "REASON / URL")]
    for r in records:
        # Its waits and runs added up, as the hub counted them when it answered.
        wait, run = r["wait_s"], r["run_s"]
        rows.append(
            (
                r["id"],
                r["spec"]["name"],
                r["spec"]["team"],
                r["spec"]["priority_class"],
                str(r.get("priority", "")),
                str(r["position"]) if r.get("position") else "-",
                _shape(r["spec"]),
                r["phase"],
                r["spoke_id"] or "-",
                _secs(wait),
                _secs(run),
                _note(r),
            )
        )
    _table(rows)
    return 0


def _none_listed(args: argparse.Namespace) -> str:
    """What an empty `gpufed jobs` means: nothing in those phases, or a team misspelt."""
    if args.team:
        known = sorted(t["team"] for t in args.client.teams())
        if args.team not in known:
            return f"no workloads: no team {args.team!r} (teams: {', '.join(known) or 'none'})"
    of = f" of team {args.team}" if args.team else ""
    return f"no workloads{of}" + (f" in phase {args.phase}" if args.phase else "")


def _explain(args: argparse.Namespace) -> int:
    r = args.client.workload(args.id)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    spec = r["spec"]
    print(f"{r['id']}  {spec['name']}  team={spec['team']}  class={spec['priority_class']}")
    print(f"  shape:  {_shape(spec)} {'/'.join(spec['gpu_models']) or 'any model'}")
    print(f"  phase:  {r['phase']}  epoch={r['epoch']}  spoke={r['spoke_id'] or '-'}")
    if r.get("endpoint"):
        print(f"  url:    {r['endpoint']}")
    if r.get("idle_s") is not None:
        print(f"  idle:   GPUs idle for {age(r['idle_s'])}")
    if r["phase"] == "queued":
        print(f"  why:    {r['message'] or 'not looked at yet'} [{r['reason'] or '-'}]")
        if r.get("cloud_instance"):
            print(f"  cloud:  {r['cloud_instance']}, starting for it")
        elif r.get("cloud_refused"):
            print(f"  cloud:  none rented: {r['cloud_refused']}")
    elif r["message"]:
        print(f"  result: {r['message']}")
    print("  history:")
    t0 = r["submitted_at"]
    for h in r["history"]:
        where = f" on {h['spoke_id']}" if h.get("spoke_id") else ""
        detail = f"  {h['detail']}" if h.get("detail") else ""
        print(f"    +{h['at'] - t0:7.3f}s  {h['event']}{where}{detail}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    r = args.client.cancel(args.id)
    print(f"{r['id']}: {'cancelled' if r['phase'] == 'cancelled' else 'cancel requested'}")
    return 0


def _spokes(args: argparse.Namespace) -> int:
    spokes = args.client.spokes()
    if args.json:
        print(json.dumps(spokes, indent=2))
        return 0
    rows = [("SPOKE", "REGION", "KIND", "STATUS", "NODES", "GPUS (free/total)", "RUNNING")]
    for s in spokes:
        gpus = ", ".join(f"{m} {v['free']:g}/{v['total']:g}" for m, v in sorted(s["gpus"].items()))
        status = spoke_status(s)
        rows.append(
            (s["id"], s["region"], s["kind"], status, str(s["nodes"]), gpus, str(s["running"]))
        )
    _table(rows)
    for s in spokes:
        if s.get("cordoned"):
            c = s["cordoned"]
            why = f": {c['reason']}" if c["reason"] else ""
            print(f"{s['id']} cordoned by {c['by']} {age(time.time() - c['at'])} ago{why}")
    return 0


def _policy(args: argparse.Namespace) -> int:
    if args.action == "show":
        document = args.client.policy()
        if args.at is not None:
            try:
                document = policy_in_force(document, parse_when(args.at, time.time()))
            except ValueError as exc:
                print(f"gpufed policy show --at: {exc}", file=sys.stderr)
                return 2
        print(yaml.safe_dump(document, sort_keys=False), end="")
        return 0
    if args.file is None:
        print("gpufed policy set: give the policy file", file=sys.stderr)
        return 2
    try:
        document = read_mapping(args.file, empty_ok=False)  # never an empty policy by mistake
    except ValueError as exc:
        print(f"gpufed: {exc}", file=sys.stderr)
        return 1
    result = args.client.set_policy(document)
    print(f"policy in force: {len(result.get('teams', []))} teams")
    fleet = {model for spoke in args.client.spokes() for model in spoke.get("gpus", {})}
    for line in [*unknown_models(result, fleet), *overlapping_windows(result, time.time())]:
        print(f"gpufed policy set: warning: {line}", file=sys.stderr)
    return 0


def _usage(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        since = parse_when(args.since, now) if args.since else 0.0
        until = parse_when(args.until, now) if args.until else None
    except ValueError as exc:
        print(f"gpufed usage: {exc}", file=sys.stderr)
        return 2
    data = args.client.usage(since, until, args.by)
    kept_since = data.get("kept_since")
    if kept_since is not None and since < kept_since:
        print(
            "gpufed usage: runs of workloads that ended before "
            f"{datetime.fromtimestamp(kept_since, UTC):%Y-%m-%d %H:%M:%S} UTC are not counted: "
            "the hub no longer keeps them (gpufed hub --keep-ended)",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    header = (args.by.upper(), "GPU-H ON-PREM", "GPU-H CLOUD", "RUNS", "CLOUD COST $")
    rows = [header]
    # A table is read by people (three decimals: 3.6 s); CSV by programs that add it up, so it
    # keeps the precision a short run needs (a two-second job is 0.000556 GPU-hours, not 0.001).
    hours = "{:.6f}" if args.csv else "{:.3f}"
    for key, u in data["rows"].items():
        cost = "-" if args.by == "user" else f"{u['cloud_cost']:.2f}"
        rows.append(
            (
                key,
                hours.format(u["gpu_hours_onprem"]),
                hours.format(u["gpu_hours_cloud"]),
                str(int(u["attempts"])),
                cost,
            )
        )
    t = data["totals"]
    total = (
        "TOTAL",
        hours.format(t["gpu_hours_onprem"]),
        hours.format(t["gpu_hours_cloud"]),
        str(int(t["attempts"])),
        f"{t['cloud_cost']:.2f}",
    )
    if args.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow([h.lower().replace(" ", "_").replace("-", "_") for h in header])
        writer.writerows([*rows[1:], total])
        return 0
    _table([*rows, total])
    return 0


def _logs(args: argparse.Namespace) -> int:
    tail = max(1, min(args.bytes, 128 * 1024))
    try:
        chunk = args.client.log(args.id, None, tail)
    except ApiError as exc:
        if not (args.follow and exc.code == "conflict"):  # it has not run anywhere yet
            raise
        try:
            if not _until_placed(args):
                return 1
        except KeyboardInterrupt:
            return 0
        chunk = args.client.log(args.id, None, tail)
    sys.stdout.write(chunk["data"])
    sys.stdout.flush()
    if not args.follow:
        return 0
    offset, epoch = chunk["next_offset"], chunk["epoch"]
    try:
        while True:
            chunk = args.client.log(args.id, offset)
            if chunk["epoch"] != epoch:
                print(f"\n--- run {chunk['epoch']} ---", flush=True)
                epoch, offset = chunk["epoch"], 0
                continue
            sys.stdout.write(chunk["data"])
            sys.stdout.flush()
            offset = chunk["next_offset"]
            if not chunk["data"]:
                if chunk["phase"] not in ("queued", "placed", "running"):
                    return 0
                time.sleep(1.0)
    except KeyboardInterrupt:
        return 0


def _until_placed(args: argparse.Namespace) -> bool:
    """`logs -f` of work not placed yet: wait for a spoke to take it, saying once why it waits
    (a user submits, then follows at once); False, said, if it ends without running."""
    said = False
    while True:
        r = args.client.workload(args.id)
        if r["spoke_id"] is not None or r["attempts"]:
            return True
        if r["phase"] != "queued":
            print(f"gpufed logs: {args.id} {r['phase']} without running", file=sys.stderr)
            return False
        if not said:
            why = r["message"] or "not looked at yet"
            print(
                f"gpufed logs: {args.id} is queued ({why}); waiting for it to start "
                "(Ctrl-C to stop)",
                file=sys.stderr,
                flush=True,
            )
            said = True
        time.sleep(1.0)


def _top(args: argparse.Namespace) -> int:
    from gpufed.top import run_top

    return run_top(args.client, args.interval, once=args.once)


def _shape(spec: dict[str, Any]) -> str:
    if spec.get("gpu_fraction"):
        return f"{spec['gpu_fraction']:g}"
    if spec["nodes"] > 1:
        return f"{spec['nodes']}x{spec['gpus_per_node']}"
    return str(spec["gpus_per_node"])


def _note(r: dict[str, Any]) -> str:
    """The jobs table's last column: why it waits, why it failed (its log: `gpufed logs`), why
    the hub stopped it (a session culled when idle), or its URL and how long its GPUs sat
    idle."""
    if r["phase"] == "queued":
        if r.get("cloud_instance"):
            return f"{r['message']}; cloud instance {r['cloud_instance']}"
        if r.get("cloud_refused"):
            return f"{r['message']}; no cloud instance: {r['cloud_refused']}"
        return str(r["message"])
    if r["phase"] == "failed":
        return without_log_path(str(r["message"]))
    if r["phase"] == "cancelled" and r.get("stop_notice"):
        return str(r["stop_notice"])  # the policy's stop: a notebook gone without a word else
    parts = [f"GPUs idle {age(r['idle_s'])}"] if r.get("idle_s") is not None else []
    if r.get("endpoint"):
        parts.append(str(r["endpoint"]))
    return "  ".join(parts)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
