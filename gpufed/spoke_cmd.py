"""`gpufed spoke`: run a spoke agent in a cluster (its flags, and the settings built from
them)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from gpufed import logs
from gpufed.cliflags import add_nats_flags, check_nats_files, given, nats_url, pair


def add_spoke_command(sub: Any) -> None:
    """Add `spoke` to the `gpufed` subcommands."""
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
    add_nats_flags(spoke)
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
        "--expose-url-host",
        default=None,
        help="host name in their URLs (default: --expose-host); {id} in it is each one's "
        "workload id, a host name of its own (wildcard DNS), so browsers keep their cookies "
        "apart",
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
        check_nats_files(args)
        labels = dict(pair(item) for item in args.label)
        settings = SpokeSettings(
            id=args.id,
            region=args.region,
            kind=args.kind,
            nats_url=nats_url(args),
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
            **given(keep_ended_s=args.keep_ended, keep_ended=args.keep_ended_max),
        )
        asyncio.run(serve_spoke(settings))
    except ValidationError as exc:  # a setting refused: named by its flag
        print(f"gpufed spoke: {refused_settings(exc, args.parser, SPOKE_FLAGS)}", file=sys.stderr)
        return 1
    except (SpokeError, ValueError, FolderBusy) as exc:
        print(f"gpufed spoke: {exc}", file=sys.stderr)
        return 1
    return 0
