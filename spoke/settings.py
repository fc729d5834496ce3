"""The spoke's one settings model, read once in main and passed down."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, field_validator

from schemas import SpokeKind
from schemas.common import SPOKE_ID_PATTERN
from spoke.relay import checked_url_host

#: An ended workload's files (log, workspace, load file) are kept a week, those of the last
#: 10,000 ended workloads at most (spoke.runtime.retention).
KEEP_ENDED_S = 7 * 24 * 3600.0
KEEP_ENDED = 10_000


class SpokeSettings(BaseModel):
    id: str = Field(pattern=SPOKE_ID_PATTERN)
    region: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    kind: SpokeKind = SpokeKind.ONPREM
    nats_url: str = "nats://127.0.0.1:4222"
    nats_token: str | None = Field(default=None, repr=False)
    nats_creds: Path | None = Field(default=None, description="NATS .creds file (0600).")
    nats_ca: Path | None = Field(default=None, description="CA of the NATS server (TLS).")
    inventory: str = "static:inventory.yaml"
    runtime: str = "local"
    state_dir: Path = Path(".gpufed/spokes")
    heartbeat_s: float = Field(default=2.0, gt=0)
    labels: dict[str, str] = Field(default_factory=dict)
    price_per_gpu_hour: float = Field(default=0.0, ge=0)
    stop_grace_s: float = Field(default=5.0, ge=0)
    resync_interval_s: float = Field(default=30.0, gt=0)
    # Stop movable work after this long without hearing the hub; None: derived from the hub's
    # lost_after (always lowered to that, whatever is set here). See spoke/fencing.py.
    fence_after_s: float | None = Field(default=None, gt=0)
    # Instance metadata to watch for a spot interruption notice (EC2: http://169.254.169.254);
    # None: not watched. On a notice the spoke drains (see spoke/interruption.py).
    interruption_imds_url: str | None = None
    max_pending_events: int = Field(default=100_000, ge=1)
    journal_fsync: bool = Field(
        default=False,
        description="fsync the journal before each message that depends on it (survives a "
        "machine crash, at a disk write per batch); off: flushed to the OS only.",
    )
    stop_workloads_on_exit: bool = False
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Serve Prometheus metrics here (None: off)."
    )
    metrics_host: str = "127.0.0.1"
    # Local runtime: where sessions and services are exposed (their relays listen), and the
    # host name their URLs carry (None: expose_host; `{id}` in it: each workload's id, a host
    # name of its own). 127.0.0.1: reachable on this host only.
    expose_host: str = "127.0.0.1"
    expose_url_host: str | None = None
    # Local runtime: the unprivileged user workloads run as (the spoke must be root); None:
    # the spoke's own user, which makes the local runtime no isolation boundary (README).
    run_as: str | None = None
    # Local and Slurm runtimes: how long an ended workload's log and workspace are kept, and
    # for how many ended workloads at most (the oldest go first).
    keep_ended_s: float = Field(default=KEEP_ENDED_S, gt=0)
    keep_ended: int = Field(default=KEEP_ENDED, ge=0)
    kubeconfig: str | None = None
    kube_context: str | None = None
    # Slurm: the partition this spoke offers and submits to, and the account and QOS its jobs
    # run under (None: the cluster's defaults).
    slurm_partition: str | None = None
    slurm_account: str | None = None
    slurm_qos: str | None = None

    @field_validator("expose_url_host")
    @classmethod
    def _url_host(cls, value: str | None) -> str | None:
        return None if value is None else checked_url_host(value)

    @property
    def workdir(self) -> Path:
        return self.state_dir / self.id
