"""The `gpufed` command."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import nats.errors as nats_errors

from gpufed import __version__, logs
from gpufed.authority_cmd import add_authority_commands
from gpufed.cliflags import add_nats_flags, check_nats_files, given, nats_url, read_secret
from gpufed.spoke_cmd import add_spoke_command

if TYPE_CHECKING:
    from hub.settings import HubSettings


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `gpufed jobs | head`: the reader left. No traceback; stdout pointed at /dev/null so
        # the flush at exit does not fail again (as Python's signal docs advise).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpufed", description="Federate GPU clusters into one self-service GPU cloud."
    )
    p.add_argument("--version", action="version", version=f"gpufed {__version__}")
    sub = p.add_subparsers(metavar="COMMAND")

    up = sub.add_parser("up", help="run NATS, the hub and three simulated spokes on this machine")
    up.add_argument("--demo", action="store_true", help="submit a mixed workload and report")
    up.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".gpufed"),
        help="everything it keeps: store, NATS, spokes, secrets, logs (.gpufed)",
    )
    up.add_argument("--api-port", type=int, default=8080, help="the hub's API port (8080)")
    up.add_argument(
        "--hubs",
        type=_positive,
        default=1,
        help="hub replicas (2: one leads, one stands by; on an embedded PostgreSQL)",
    )
    up.add_argument(
        "--tls",
        action="store_true",
        help="NATS over TLS with a generated local CA (<data-dir>/secrets/tls/ca.pem)",
    )
    up.set_defaults(func=_up)

    hub = sub.add_parser("hub", help="run the hub (policy, placement, REST API)")
    add_nats_flags(hub)
    hub.add_argument("--store-url", default=None, help="SQLAlchemy URL (default SQLite)")
    hub.add_argument(
        "--store-url-file",
        type=Path,
        default=None,
        help="read the store URL (one with a password) from this file, e.g. a mounted Secret",
    )
    hub.add_argument(
        "--data-dir",
        type=Path,
        default=Path(".gpufed/hub"),
        help="where the SQLite store is kept when there is no --store-url (.gpufed/hub)",
    )
    hub.add_argument(
        "--api-host", default="127.0.0.1", help="address the API listens on (this host only)"
    )
    hub.add_argument("--api-port", type=int, default=8080, help="the API's port (8080)")
    hub.add_argument(
        "--advertise-url",
        default="",
        help="the API URL a standby names when this hub leads (default http://HOST:PORT)",
    )
    hub.add_argument("--policy", type=Path, default=None, help="policy YAML file")
    hub.add_argument(
        "--admin-token-file",
        type=Path,
        default=None,
        help="file holding a static admin bearer token beside the stored API tokens "
        "(default $GPUFED_ADMIN_TOKEN; prefer `gpufed token create --store-url`)",
    )
    # Refused with a sentence (not "unrecognized arguments"): `ps` shows argv to every user.
    hub.add_argument("--admin-token", default=None, help=argparse.SUPPRESS)
    hub.add_argument(
        "--oidc-config",
        type=Path,
        default=None,
        help="YAML: OIDC issuer, JWKS file or URL, groups -> team roles (see docs/access.md)",
    )
    hub.add_argument("--suspect-after", type=float, default=15.0, help="s of silence: no new work")
    hub.add_argument("--lost-after", type=float, default=120.0, help="s of silence: move its work")
    hub.add_argument(
        "--drain",
        type=int,
        default=10,
        help="s a stopping hub lets API requests in flight finish before it cuts them",
    )
    hub.add_argument(
        "--event-domain",
        action="append",
        default=[],
        metavar="DOMAIN",
        help="source the event stream of the regional leaf node with this JetStream domain",
    )
    hub.add_argument(
        "--keep-ended",
        type=float,
        default=None,
        metavar="S",
        help="s an ended workload stays in the store and in usage reports (90 days)",
    )
    hub.add_argument(
        "--audit-refusals",
        type=int,
        default=None,
        metavar="N",
        help="refusals alike (one caller, action, team and result) audited one by one a "
        "minute; the rest counted in one entry (10; 0: every one)",
    )
    hub.add_argument(
        "--api-rate",
        type=float,
        default=None,
        metavar="R",
        help="API requests a second each caller may make, sustained, past --api-burst at once "
        "(20; admins are not limited; 0: no limit): 429 with Retry-After beyond",
    )
    hub.add_argument(
        "--api-burst", type=int, default=None, metavar="N", help="API requests at once (200)"
    )
    hub.set_defaults(func=_hub, parser=hub)

    add_spoke_command(sub)

    from gpufed import commands

    commands.add_client_commands(sub)

    from gpufed.burst_entry import add_burst_parser

    add_burst_parser(sub)

    from gpufed.replay.cli import add_replay_parser

    add_replay_parser(sub)

    region = sub.add_parser(
        "region-streams",
        help="on a regional leaf node: mirror its spokes' commands, keep their events locally",
    )
    add_nats_flags(region)  # the region's leaf node, e.g. with admin.creds of nats-authority
    region.add_argument("--hub-domain", default="hub", help="the hub's JetStream domain")
    region.add_argument("--spoke", action="append", required=True, metavar="ID")
    region.add_argument(
        "--wait-for-hub", type=float, default=120.0, metavar="S",
        help="how long to wait for the hub's command stream before mirroring it (s)",
    )  # fmt: skip
    region.set_defaults(func=_region_streams)

    add_authority_commands(sub)

    schemas_cmd = sub.add_parser("schemas", help="wire schemas")
    schemas_sub = schemas_cmd.add_subparsers(metavar="ACTION")
    export = schemas_sub.add_parser("export", help="write JSON Schema for every wire model")
    export.add_argument("dir", type=Path)
    export.set_defaults(func=_schemas_export)
    return p


def _up(args: argparse.Namespace) -> int:
    from gpufed.up_command import run_up

    logs.configure(level="warning")  # the processes log to files; this terminal shows progress
    return run_up(
        data_dir=args.data_dir, api_port=args.api_port, demo=args.demo, tls=args.tls, hubs=args.hubs
    )


def _hub(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gpufed.compose import loop
    from gpufed.compose.hub import serve_hub
    from gpufed.dirlock import FolderBusy
    from gpufed.settings_errors import refused_settings
    from hub.errors import HubError

    logs.configure()
    try:
        settings = _hub_settings(args)
    except ValidationError as exc:  # a setting refused: named by its flag
        renamed = {"audit_refusals_listed": "audit_refusals", "api_rate_per_s": "api_rate"}
        print(f"gpufed hub: {refused_settings(exc, args.parser, renamed)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"gpufed hub: {exc}", file=sys.stderr)
        return 1
    try:
        loop.run(serve_hub(settings))
    except (HubError, OSError, FolderBusy) as exc:
        print(f"gpufed hub: {exc}", file=sys.stderr)
        return 1
    return 0


def _hub_settings(args: argparse.Namespace) -> HubSettings:
    from hub.settings import HubSettings

    check_nats_files(args)
    if args.admin_token is not None:
        raise ValueError(
            "--admin-token: a token on the command line is in every `ps` listing; "
            "give it in $GPUFED_ADMIN_TOKEN or a file: --admin-token-file FILE"
        )
    admin_token = read_secret(args.admin_token_file, "--admin-token-file")
    if args.admin_token_file is not None and not admin_token:
        raise ValueError(f"--admin-token-file: {args.admin_token_file} is empty")
    return HubSettings(
        nats_url=nats_url(args),
        nats_creds=args.nats_creds,
        nats_ca=args.nats_ca,
        store_url=read_secret(args.store_url_file, "--store-url-file") or args.store_url,
        data_dir=args.data_dir,
        api_host=args.api_host,
        api_port=args.api_port,
        advertise_url=args.advertise_url,
        policy_file=args.policy,
        suspect_after_s=args.suspect_after,
        lost_after_s=args.lost_after,
        drain_s=args.drain,
        admin_token=admin_token or os.environ.get("GPUFED_ADMIN_TOKEN") or None,
        oidc_config=args.oidc_config,
        event_domains=tuple(args.event_domain),
        **given(
            keep_ended_s=args.keep_ended,
            audit_refusals_listed=args.audit_refusals,
            api_rate_per_s=args.api_rate,
            api_burst=args.api_burst,
        ),
    )


def _region_streams(args: argparse.Namespace) -> int:
    from bus.client import Bus, BusSettings

    async def run() -> None:
        bus = Bus(
            BusSettings(
                url=nats_url(args),
                name="gpufed-region-streams",
                user_credentials=str(args.nats_creds) if args.nats_creds else None,
                tls_ca=str(args.nats_ca) if args.nats_ca else None,
            )
        )
        await bus.connect(first_attempt_timeout_s=10)
        try:
            await bus.ensure_regional_streams(
                args.hub_domain, tuple(args.spoke), wait_for_hub_s=args.wait_for_hub
            )
        finally:
            await bus.close()

    logs.configure()
    try:
        check_nats_files(args)
        asyncio.run(run())
    except (OSError, TimeoutError, ValueError, nats_errors.Error) as exc:
        print(f"gpufed region-streams: {exc}", file=sys.stderr)
        return 1
    print(f"streams ready for {', '.join(args.spoke)} (hub domain {args.hub_domain})")
    return 0


def _schemas_export(args: argparse.Namespace) -> int:
    from gpufed.schema_export import export

    for path in export(args.dir):
        print(path)
    return 0


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value
