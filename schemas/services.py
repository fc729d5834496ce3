"""Inference services: a named set of replicas the hub keeps up, scales and updates.

A `ServiceSpec` is what a user creates; each replica the hub starts for it is a workload built
from `replica` (`ReplicaTemplate.workload_spec`). The load signal that drives autoscaling and
the request counts behind cost per 1,000 requests are the replicas' requests as the gateway
routes them (docs/services.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any

from pydantic import Field, model_validator

from schemas.common import KEEPS_UNKNOWN, DnsLabel, SpecParts, WireModel, extra_fields
from schemas.errors import describe_problems, problems_unknown_first
from schemas.workloads import (
    SECRET_MASK,
    Affinity,
    GpuModel,
    RestartPolicy,
    WorkloadSpec,
    accept_secret_values,
)

#: Most replicas one service may ask for.
MAX_REPLICAS = 64


class ReplicaTemplate(WireModel):
    """What each replica runs: the WorkloadSpec fields that make sense for a server.

    The server listens on the port the runtime gives it in `$GPUFED_PORT`.
    """

    model_config = KEEPS_UNKNOWN  # a typo is refused (`unknown_fields`), not ignored

    command: tuple[str, ...] = Field(min_length=1, max_length=256)
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: tuple[str, ...] = ()
    image: str | None = Field(default=None, max_length=512)
    working_dir: str | None = Field(default=None, max_length=4096)
    gpus: int = Field(default=1, ge=1, le=16)
    gpu_fraction: float | None = Field(default=None, gt=0, lt=1)
    gpu_models: tuple[GpuModel, ...] = Field(default=(), max_length=16)

    @model_validator(mode="before")
    @classmethod
    def _accept_secret_values(cls, data: Any) -> Any:
        return accept_secret_values(data)  # as in a WorkloadSpec

    def workload_spec(
        self, *, name: str, team: str, priority_class: str, affinity: Affinity
    ) -> WorkloadSpec:
        """The workload of one replica (validated as any submission is)."""
        return WorkloadSpec.model_validate(
            {
                "name": name,
                "team": team,
                "kind": "service",
                "priority_class": priority_class,
                "command": self.command,
                "env": self.env,
                "secret_env": self.secret_env,
                "image": self.image,
                "working_dir": self.working_dir,
                "gpus_per_node": 1 if self.gpu_fraction is not None else self.gpus,
                "gpu_fraction": self.gpu_fraction,
                "gpu_models": self.gpu_models,
                "affinity": affinity.model_dump(),
                # The service controller replaces a failed replica itself (a new workload).
                "restart_policy": RestartPolicy.NEVER.value,
            }
        )


class HealthCheck(WireModel):
    """An HTTP GET the hub sends each replica every `period_s`: 2xx/3xx is healthy.

    A replica is ready after its first healthy answer; one that fails `failure_threshold`
    times in a row, or is not healthy within `startup_s` of starting, is replaced.
    """

    model_config = KEEPS_UNKNOWN  # a typo is refused (`unknown_fields`), not ignored

    path: str = Field(default="/", max_length=1024, pattern=r"^/[^\s]*$")
    period_s: float = Field(default=2.0, ge=0.05, le=300)
    timeout_s: float = Field(default=2.0, gt=0, le=60)
    failure_threshold: int = Field(default=3, ge=1, le=100)
    startup_s: float = Field(default=300.0, gt=0, le=3600)


class ScaleMetric(StrEnum):
    """The load signal autoscaling follows."""

    RPS = "rps"  # requests per second per replica
    QUEUE = "queue"  # requests in flight or waiting, per replica


class Autoscaling(WireModel):
    """Replicas = ceil(load / target), within [min_replicas, max_replicas].

    Scaling up is immediate; scaling down waits `scale_down_delay_s` (the most replicas asked
    for within that window win). With min_replicas 0 a service idle (no request) for
    `scale_to_zero_after_s` drops to zero replicas, and the first request waits for one.
    """

    model_config = KEEPS_UNKNOWN  # a typo is refused (`unknown_fields`), not ignored

    metric: ScaleMetric = ScaleMetric.RPS
    target: float = Field(default=10.0, gt=0, le=1e6)
    window_s: float = Field(default=10.0, ge=0.5, le=600, description="rps averaging window")
    scale_down_delay_s: float = Field(default=30.0, ge=0, le=24 * 3600)
    scale_to_zero_after_s: float = Field(default=60.0, ge=0, le=24 * 3600)
    wake_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="How long a request waits at the gateway for a ready replica.",
    )


class ServiceSpec(WireModel):
    """An inference service: `replica` run min..max times behind the gateway."""

    model_config = KEEPS_UNKNOWN  # a typo is refused (`unknown_fields`), not ignored

    name: DnsLabel
    team: DnsLabel
    priority_class: DnsLabel = "production"
    replica: ReplicaTemplate
    min_replicas: int = Field(default=1, ge=0, le=MAX_REPLICAS)
    max_replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    health: HealthCheck = Field(default_factory=HealthCheck)
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    regions: tuple[DnsLabel, ...] = Field(
        default=(),
        max_length=32,
        description="Regions replicas may run in, most preferred first; empty means any.",
    )
    spread: bool = Field(
        default=True, description="Spread replicas over `regions` (else fill the first)."
    )
    public: bool = Field(
        default=False,
        description="Whether the gateway serves it without a bearer token (default: a token "
        "that may read the team's work).",
    )

    @model_validator(mode="before")
    @classmethod
    def _replicas_shorthand(cls, data: Any) -> Any:
        # `replicas: 2` pins both bounds.
        if isinstance(data, dict) and "replicas" in data:
            data = dict(data)
            count = data.pop("replicas")
            if "min_replicas" in data or "max_replicas" in data:
                raise ValueError("give replicas or min_replicas/max_replicas, not both")
            data["min_replicas"] = data["max_replicas"] = count
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ServiceSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})"
            )
        if len(set(self.regions)) != len(self.regions):
            raise ValueError("regions lists a region twice")
        replica = self.replica
        if replica.gpu_fraction is not None and replica.gpus != 1:
            raise ValueError("replica.gpu_fraction needs replica.gpus=1")
        # The replica's workload must be valid as a submission: check it now, with the
        # service's own name, so the error names the field at creation, not at scale-up.
        try:
            self.replica_spec(0, self.regions[0] if self.regions else None)
        except ValueError as exc:
            raise ValueError(f"replica: {_problems(exc)}") from None
        return self

    def redacted(self) -> ServiceSpec:
        """This spec with its replicas' secret env values masked (for showing back)."""
        if not self.replica.secret_env:
            return self
        secret = set(self.replica.secret_env)
        env = {k: (SECRET_MASK if k in secret else v) for k, v in self.replica.env.items()}
        return self.model_copy(update={"replica": self.replica.model_copy(update={"env": env})})

    def replica_spec(self, index: int, region: str | None, pin: bool = False) -> WorkloadSpec:
        """The workload of replica `index`: it prefers `region` (None: none), or must run
        there when `pin` (the controller pins it to a region that has room for it)."""
        affinity = Affinity(
            required_regions=(region,) if pin and region else self.regions,
            preferred_regions=(region,) if region else (),
        )
        return self.replica.workload_spec(
            name=f"{self.name[:52]}-r{index % 10_000}",
            team=self.team,
            priority_class=self.priority_class,
            affinity=affinity,
        )


#: A service spec's parts whose fields are checked (`unknown_fields`, `service_problems`).
SERVICE_PARTS: SpecParts = (
    ("", ServiceSpec),
    ("replica.", ReplicaTemplate),
    ("health.", HealthCheck),
    ("autoscaling.", Autoscaling),
)


def unknown_fields(spec: ServiceSpec) -> list[tuple[str, str | None]]:
    """The fields a writer named that the spec does not have (`replica.`, `health.`,
    `autoscaling.`-prefixed inside those), each with the nearest one it has, if any: the hub
    refuses such a spec rather than run something other than what was asked."""
    return extra_fields(spec, SERVICE_PARTS)


def service_problems(errors: Sequence[Mapping[str, Any]], data: object) -> tuple[str | None, str]:
    """Why `data` is no service spec, its unknown fields first (`problems_unknown_first`; a
    valid spec's unknown fields are `unknown_fields`)."""
    return problems_unknown_first(errors, data, SERVICE_PARTS)


def _problems(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    return describe_problems(errors())[1] if callable(errors) else str(exc)
