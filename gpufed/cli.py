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
from gpufed.secretfile import read_secret_file

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
    _add_nats_flags(hub)
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
        "--admin-token",
        default=os.environ.get("GPUFED_ADMIN_TOKEN"),
        help="a static admin bearer token beside the stored API tokens "
        "(default $GPUFED_ADMIN_TOKEN; prefer `gpufed token create --store-url`)",
    )
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
    hub.set_defaults(func=_hub, parser=hub)

    spoke = sub.add_parser("spoke", help="run a spoke agent in a cluster")
    spoke.add_argument(
        "--id", required=True, help="this spoke's name, one per spoke in the federation"
    )
    spoke.add_argument(
        "--region", required=True, help="its region (workloads and policy may ask for one)"
    )
    spoke.add_argument(
        "--kind",
        choices=["onprem", "cloud"],
        default="onprem",
        help="cloud: an instance rented by burst (onprem)",
    )
    _add_nats_flags(spoke)
    spoke.add_argument(
        "--inventory",
        default="nvml",
        help="static:FILE (simulated GPUs), nvml, kubernetes or slurm",
    )
    spoke.add_argument(
        "--runtime",
        choices=["local", "kubernetes", "slurm"],
        default="local",
        help="what runs the work: processes here, one Job each, one sbatch job each (local)",
    )
    spoke.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".gpufed/spokes"),
        help="its journal, logs and workspaces go in STATE_DIR/ID (.gpufed/spokes)",
    )
    spoke.add_argument("--heartbeat", type=float, default=2.0, help="seconds between reports")
    spoke.add_argument(
        "--label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a label of every node here, for workloads' required_labels (repeat)",
    )
    spoke.add_argument(
        "--price",
        type=float,
        default=0.0,
        help="$ per GPU-hour (cloud rent, or on-prem amortised; prices service requests)",
    )
    spoke.add_argument("--resync-interval", type=float, default=30.0, help="s between full syncs")
    spoke.add_argument(
        "--fence-after",
        type=float,
        default=None,
        help="s without hearing the hub before movable work stops (default and maximum: the "
        "hub's lost_after less the stop grace and 3 heartbeats)",
    )
    spoke.add_argument("--stop-grace", type=float, default=5.0, help="SIGTERM to SIGKILL s")
    spoke.add_argument(
        "--interruption-imds",
        default=None,
        metavar="URL",
        help="watch this instance metadata service for a spot interruption notice and drain "
        "(EC2: http://169.254.169.254)",
    )
    spoke.add_argument(
        "--stop-workloads-on-exit",
        action="store_true",
        help="stop running work when the spoke stops (default: it runs on and is re-adopted)",
    )
    spoke.add_argument(
        "--journal-fsync",
        action="store_true",
        help="fsync the spoke's journal before each message that depends on it (default: "
        "flushed to the OS, which survives the process but not the machine crashing)",
    )
    spoke.add_argument(
        "--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port"
    )
    spoke.add_argument(
        "--metrics-host", default="127.0.0.1", help="address /metrics listens on (this host only)"
    )
    spoke.add_argument(
        "--expose-host",
        default="127.0.0.1",
        help="local runtime: address sessions and services listen on (default: this host only)",
    )
    spoke.add_argument(
        "--expose-url-host", default=None, help="host name in their URLs (default: --expose-host)"
    )
    spoke.add_argument(
        "--run-as",
        default=None,
        metavar="USER",
        help="local runtime, spoke run as root: start workloads as this unprivileged user",
    )
    spoke.add_argument(
        "--keep-ended",
        type=float,
        default=None,
        metavar="S",
        help="local and Slurm runtimes: s an ended workload's log and workspace are kept (a week)",
    )
    spoke.add_argument(
        "--keep-ended-max",
        type=int,
        default=None,
        metavar="N",
        help="local and Slurm runtimes: keep those of the last N ended workloads at most (10000)",
    )
    spoke.add_argument(
        "--kubeconfig",
        default=None,
        help="Kubernetes: kubeconfig file (default: the pod's service account in a pod, else "
        "$KUBECONFIG or ~/.kube/config)",
    )
    spoke.add_argument(
        "--context", default=None, help="Kubernetes: the kubeconfig's context (its current one)"
    )
    spoke.add_argument("--slurm-partition", default=None, help="Slurm partition to offer and use")
    spoke.add_argument("--slurm-account", default=None, help="Slurm account of the jobs")
    spoke.add_argument("--slurm-qos", default=None, help="Slurm QOS of the jobs")
    spoke.set_defaults(func=_spoke, parser=spoke)

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
    _add_nats_flags(region)  # the region's leaf node, e.g. with admin.creds of nats-authority
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
        print(f"gpufed hub: {refused_settings(exc, args.parser, {})}", file=sys.stderr)
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

    return HubSettings(
        nats_url=_nats_url(args),
        nats_creds=args.nats_creds,
        nats_ca=args.nats_ca,
        store_url=_read_secret(args.store_url_file, "--store-url-file") or args.store_url,
        data_dir=args.data_dir,
        api_host=args.api_host,
        api_port=args.api_port,
        advertise_url=args.advertise_url,
        policy_file=args.policy,
        suspect_after_s=args.suspect_after,
        lost_after_s=args.lost_after,
        drain_s=args.drain,
        admin_token=args.admin_token,
        oidc_config=args.oidc_config,
        event_domains=tuple(args.event_domain),
        **_given(keep_ended_s=args.keep_ended),
    )


def _region_streams(args: argparse.Namespace) -> int:
    from bus.client import Bus, BusSettings

    async def run() -> None:
        bus = Bus(
            BusSettings(
                url=_nats_url(args),
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
        asyncio.run(run())
    except (OSError, TimeoutError, ValueError, nats_errors.Error) as exc:
        print(f"gpufed region-streams: {exc}", file=sys.stderr)
        return 1
    print(f"streams ready for {', '.join(args.spoke)} (hub domain {args.hub_domain})")
    return 0


#: SpokeSettings' names that are not their flags' (beyond a `_s` suffix).
SPOKE_FLAGS = {
    "labels": "label",
    "price_per_gpu_hour": "price",
    "interruption_imds_url": "interruption_imds",
    "kube_context": "context",
    "keep_ended": "keep_ended_max",
}


def _spoke(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from gpufed.compose.spoke import serve_spoke
    from gpufed.dirlock import FolderBusy
    from gpufed.settings_errors import refused_settings
    from spoke.errors import SpokeError
    from spoke.settings import SpokeSettings

    logs.configure()
    try:
        labels = dict(_pair(item) for item in args.label)
        settings = SpokeSettings(
            id=args.id,
            region=args.region,
            kind=args.kind,
            nats_url=_nats_url(args),
            nats_creds=args.nats_creds,
            nats_ca=args.nats_ca,
            # A token is a secret: from the environment only, never a flag (argv is public).
            nats_token=os.environ.get("GPUFED_NATS_TOKEN") or None,
            inventory=args.inventory,
            runtime=args.runtime,
            state_dir=args.state_dir,
            heartbeat_s=args.heartbeat,
            labels=labels,
            price_per_gpu_hour=args.price,
            resync_interval_s=args.resync_interval,
            fence_after_s=args.fence_after,
            interruption_imds_url=args.interruption_imds,
            stop_grace_s=args.stop_grace,
            stop_workloads_on_exit=args.stop_workloads_on_exit,
            journal_fsync=args.journal_fsync,
            kubeconfig=args.kubeconfig,
            kube_context=args.context,
            slurm_partition=args.slurm_partition,
            slurm_account=args.slurm_account,
            slurm_qos=args.slurm_qos,
            metrics_port=args.metrics_port,
            metrics_host=args.metrics_host,
            expose_host=args.expose_host,
            expose_url_host=args.expose_url_host,
            run_as=args.run_as,
            **_given(keep_ended_s=args.keep_ended, keep_ended=args.keep_ended_max),
        )
        asyncio.run(serve_spoke(settings))
    except ValidationError as exc:  # a setting refused: named by its flag
        print(f"gpufed spoke: {refused_settings(exc, args.parser, SPOKE_FLAGS)}", file=sys.stderr)
        return 1
    except (SpokeError, ValueError, FolderBusy) as exc:
        print(f"gpufed spoke: {exc}", file=sys.stderr)
        return 1
    return 0


def _given(**options: object) -> dict[str, object]:
    """The options set on the command line; the others keep the settings' defaults."""
    return {name: value for name, value in options.items() if value is not None}


def _add_nats_flags(p: argparse.ArgumentParser) -> None:
    """--nats-url, --nats-creds, --nats-ca: secrets only as files or environment, never argv."""
    p.add_argument(
        "--nats-url",
        default=os.environ.get("GPUFED_NATS_URL", "nats://127.0.0.1:4222"),
        help="NATS URL (default $GPUFED_NATS_URL or nats://127.0.0.1:4222); a URL with a "
        "password belongs in $GPUFED_NATS_URL, not on the command line",
    )
    p.add_argument(
        "--nats-url-file",
        type=Path,
        default=_env_path("GPUFED_NATS_URL_FILE"),
        help="read the NATS URL (one with a password) from this file, e.g. a mounted Secret",
    )
    p.add_argument(
        "--nats-creds",
        type=Path,
        default=_env_path("GPUFED_NATS_CREDS"),
        help="NATS user credentials file (.creds, mode 0600; default $GPUFED_NATS_CREDS)",
    )
    p.add_argument(
        "--nats-ca",
        type=Path,
        default=_env_path("GPUFED_NATS_CA"),
        help="CA file the NATS server's certificate is checked against (tls:// URLs)",
    )


def _nats_url(args: argparse.Namespace) -> str:
    """--nats-url, or what --nats-url-file holds when given."""
    return _read_secret(args.nats_url_file, "--nats-url-file") or str(args.nats_url)


def _read_secret(path: Path | None, flag: str) -> str | None:
    """The stripped text of a secret file (None without one); exits naming the flag."""
    if path is None:
        return None
    try:
        return read_secret_file(path, flag)
    except ValueError as exc:
        raise SystemExit(f"gpufed: {exc}") from None


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _pair(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise ValueError(f"--label wants KEY=VALUE, got {item!r}")
    return key, value


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
