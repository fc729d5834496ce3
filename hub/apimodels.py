"""Typed request and response bodies of the REST API (their JSON Schema is in /openapi.json)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from hub.authstore import AuditEntry, TokenRecord
from hub.core.access import Principal, Role
from hub.core.lifecycle import ran_s, waited_s
from hub.records import Cordon, WorkloadRecord
from schemas.common import DNS_LABEL_PATTERN, ShortText


class ErrorOut(BaseModel):
    """Every refusal: a stable `code`, a sentence, the field at fault when there is one, and
    whether the same request may succeed later (`schemas.errors.ErrorReply` without its
    version)."""

    code: str
    message: str
    field: str | None = None
    retryable: bool = False


class WorkloadOut(WorkloadRecord):
    """A workload as the API shows it: secret env values masked, wait and run time added."""

    wait_s: float | None = Field(
        default=None,
        description="seconds it has waited for GPUs since its submission, every wait added "
        "up (a preempted workload waits again; a placed one until it starts): until its end, "
        "or until the answer while it lives",
    )
    run_s: float | None = Field(
        default=None,
        description="seconds its attempts have run, added up (one running: until the "
        "answer); null while none has started",
    )
    priority: int | None = Field(default=None, description="its class's priority value")
    position: int | None = Field(default=None, description="place in the queue (1 goes first)")
    idle_s: float | None = Field(
        default=None,
        description="seconds its GPUs have sat idle, once past the policy's idle.flag_after",
    )
    cloud_instance: str | None = Field(
        default=None,
        description="queued: the cloud instance burst is starting for it, and since when",
    )
    cloud_refused: str | None = Field(
        default=None,
        description="queued: why the burst controller rents no cloud instance for it "
        "(its latest round's word, with the reason's code in brackets)",
    )

    @classmethod
    def of(
        cls,
        record: WorkloadRecord,
        now: float,
        priority: int | None = None,
        position: int | None = None,
        idle_s: float | None = None,
        cloud_instance: str | None = None,
        cloud_refused: str | None = None,
    ) -> WorkloadOut:
        data = record.model_dump()
        data["cloud_instance"] = cloud_instance
        data["cloud_refused"] = cloud_refused
        data["priority"] = priority
        data["position"] = position
        data["idle_s"] = None if idle_s is None else round(idle_s, 1)
        data["spec"] = record.spec.redacted()
        waited = waited_s(record.submitted_at, record.attempts, record.finished_at, now)
        ran = ran_s(record.attempts, now)
        data["wait_s"] = round(waited, 3)
        data["run_s"] = None if ran is None else round(ran, 3)
        return cls.model_validate(data)


class GpuCount(BaseModel):
    total: float
    free: float


class SpokeOut(BaseModel):
    id: str
    region: str
    kind: str
    status: str = Field(description="ready, suspect (no new work) or lost (its work moved)")
    last_seen_s_ago: float
    nodes: int
    gpus: dict[str, GpuCount]
    running: int
    labels: dict[str, str]
    cordoned: Cordon | None = Field(
        default=None, description="taken out of placement: by whom, when, why (hub.cordons)"
    )


class CordonIn(BaseModel):
    """Why a spoke is taken out of placement (shown with it)."""

    model_config = ConfigDict(extra="forbid")
    reason: ShortText = ""  # no control characters: it is printed on operators' terminals


class DrainedWorkload(BaseModel):
    workload_id: str
    name: str
    team: str
    why: str = Field(default="", description="why it was left running (left_running only)")


class DrainOut(BaseModel):
    """A drained spoke: cordoned, its movable work preempted to run elsewhere."""

    spoke: SpokeOut
    requeued: list[DrainedWorkload] = Field(
        description="stopped by the spoke (with its grace), then placed elsewhere"
    )
    left_running: list[DrainedWorkload] = Field(
        description="work that may not move (restart_policy never, on_hub_loss keep)"
    )


class HealthOut(BaseModel):
    ok: bool
    role: Literal["leader", "standby"]  # a standby answers reads and refuses writes (503)
    term: int  # the leadership term this hub leads (0: never led)
    leader: str = ""  # the leading replica's API URL, as far as this one knows ("": unknown)
    # "unavailable" while every store call fails for the store's own sake (503
    # store_unavailable), since that time (Unix seconds)
    store: Literal["ok", "unavailable"] = "ok"
    store_unavailable_since: float | None = None
    workloads_active: int
    spokes: int
    counters: dict[str, int]


class TokenCreate(BaseModel):
    """A token to mint: `admin` takes no team, every other role one."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=63)
    role: Role
    team: str | None = Field(default=None, pattern=DNS_LABEL_PATTERN, max_length=63)
    ttl_s: float | None = Field(default=None, gt=0, le=10 * 365 * 24 * 3600)


class TokenOut(BaseModel):
    """A token without its secret."""

    id: str
    user: str
    team: str | None
    role: str
    created_at: float
    created_by: str
    expires_at: float | None = None
    revoked_at: float | None = None

    @classmethod
    def of(cls, record: TokenRecord) -> TokenOut:
        return cls.model_validate(record.model_dump(exclude={"secret_hash"}))


class TokenCreated(TokenOut):
    token: str = Field(description="The bearer token; shown this once, never again.")


class WhoAmI(BaseModel):
    user: str
    admin: bool
    teams: dict[str, str]
    via: str

    @classmethod
    def of(cls, principal: Principal) -> WhoAmI:
        teams = {team: role.value for team, role in principal.teams.items()}
        return cls(user=principal.user, admin=principal.admin, teams=teams, via=principal.via)


AuditOut = AuditEntry


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for our error shape."""
    return {status: {"model": ErrorOut} for status in statuses}
