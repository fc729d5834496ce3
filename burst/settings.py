"""The burst service's one settings model, read once in main and passed down."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from burst.core.model import BurstPolicy, MarketPreference, TeamBudget
from burst.core.planner import ID_PREFIX


class TeamBudgetSettings(BaseModel):
    """A team's limits: a $/h rate over its live instances and/or a total $ (None: no limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dollars_per_hour: float | None = Field(default=None, ge=0)
    dollars_total: float | None = Field(default=None, ge=0)


class BurstSettings(BaseModel):
    """Everything `gpufed burst` needs. Times are seconds; None means unlimited."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nats_url: str = "nats://127.0.0.1:4222"
    nats_creds: Path | None = Field(default=None, description="The controller's .creds file.")
    nats_ca: Path | None = Field(
        default=None, description="CA of the NATS server (TLS); cloud spokes get it too."
    )
    nats_issuer: Path | None = Field(
        default=None,
        description="Issuer file (0600) to mint and revoke per-instance spoke credentials; "
        "None: cloud spokes get no credential (only for a NATS server without auth).",
    )
    instance_credential_ttl_s: int = Field(
        default=12 * 3600, ge=60, description="Lifetime of an instance's NATS credential."
    )
    provider: Literal["local", "aws"] = "local"
    tick_s: float = Field(default=2.0, gt=0, description="Seconds between planning rounds.")
    id_prefix: str = Field(
        default="burst",
        pattern=ID_PREFIX.pattern,
        description="Start of every burst id; keep it stable across restarts of one deployment.",
    )
    catalog: Path | None = Field(default=None, description="Catalog YAML; None: the default.")

    # --- planner policy (see burst.core.model.BurstPolicy) ---
    burst_after_s: float = Field(default=60.0, ge=0)
    idle_ttl_s: float = Field(default=300.0, ge=0)
    cooldown_s: float = Field(default=120.0, ge=0)
    capacity_backoff_s: float = Field(default=180.0, ge=0)
    boot_timeout_s: float = Field(default=1200.0, ge=0)
    demand_stale_s: float = Field(default=120.0, ge=0)
    max_instances: int | None = Field(default=10, ge=0)
    max_dollars_per_hour: float | None = Field(default=None, ge=0)
    allowed_teams: frozenset[str] | None = None
    team_budgets: dict[str, TeamBudgetSettings] = Field(default_factory=dict)
    markets: MarketPreference = MarketPreference.SPOT_FIRST
    regions: frozenset[str] | None = None
    wait_per_gpu_s: float = Field(default=0.0, ge=0)
    right_size: bool = True
    burst_restarted: bool = False

    # --- the controller's own housekeeping ---
    reconcile_s: float = Field(
        default=30.0, gt=0, description="How often instances are re-checked with the provider."
    )
    orphan_grace_s: float = Field(
        default=300.0, ge=0, description="Age before an instance no record knows is terminated."
    )
    launch_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="How long a `requested` record may be missing at the provider (a launch "
        "interrupted by a crash, or a cloud API that lists new instances late) before it is "
        "marked failed.",
    )
    spoke_silent_s: float = Field(
        default=120.0,
        gt=0,
        description="A cloud spoke silent this long counts as idle since it was last heard.",
    )
    state_timeout_s: float = Field(default=2.0, gt=0, description="Wait for the hub's state.")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Serve Prometheus metrics here (None: off)."
    )
    metrics_host: str = "127.0.0.1"

    # --- local provider: cloud spokes as processes on this machine ---
    state_dir: Path = Path(".gpufed/burst")
    python: str = sys.executable
    spoke_nats_url: str | None = Field(
        default=None, description="NATS URL the cloud spokes dial; None: `nats_url`."
    )
    spoke_heartbeat_s: float = Field(default=1.0, gt=0)
    local_stop_grace_s: float = Field(default=15.0, ge=0)

    # --- aws provider (one region) ---
    aws_region: str = "us-east-1"
    aws_image_id: str | None = None
    aws_subnet_ids: tuple[str, ...] = ()
    aws_security_group_ids: tuple[str, ...] = ()
    aws_instance_profile: str | None = None
    aws_key_name: str | None = None
    aws_cluster: str = "default"
    aws_package: str = "gpufed[nvml]"
    aws_root_volume_gib: int | None = Field(default=200, ge=1)
    aws_root_device_name: str = "/dev/sda1"
    aws_endpoint_url: str | None = None
    aws_profile: str | None = None

    @property
    def spoke_url(self) -> str:
        """The NATS URL a cloud spoke joins the hub with."""
        return self.spoke_nats_url or self.nats_url

    def policy(self) -> BurstPolicy:
        """The planner's policy. The aws provider serves one region: other regions are left out."""
        regions = self.regions
        if self.provider == "aws":
            regions = frozenset({self.aws_region}) if regions is None else regions
            regions = regions & {self.aws_region}
        return BurstPolicy(
            burst_after_s=self.burst_after_s,
            idle_ttl_s=self.idle_ttl_s,
            cooldown_s=self.cooldown_s,
            capacity_backoff_s=self.capacity_backoff_s,
            boot_timeout_s=self.boot_timeout_s,
            demand_stale_s=self.demand_stale_s,
            max_instances=self.max_instances,
            max_dollars_per_hour=self.max_dollars_per_hour,
            team_budgets={
                team: TeamBudget(b.dollars_per_hour, b.dollars_total)
                for team, b in self.team_budgets.items()
            },
            allowed_teams=self.allowed_teams,
            markets=self.markets,
            regions=regions,
            wait_per_gpu_s=self.wait_per_gpu_s,
            right_size=self.right_size,
            burst_restarted=self.burst_restarted,
        )
