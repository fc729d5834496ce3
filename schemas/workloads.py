"""What a user submits, and what the hub answers."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, StringConstraints, field_validator, model_validator

from schemas.common import (
    GPU_MODEL_PATTERN,
    KEEPS_UNKNOWN,
    DnsLabel,
    Identifier,
    SpecParts,
    WireModel,
    extra_fields,
    refuse_control,
)
from schemas.errors import ErrorReply, problems_unknown_first

MAX_COMMAND_ITEMS = 256
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV_ENTRIES = 128
MAX_ENV_BYTES = 64 * 1024
MAX_GPUS_PER_NODE = 16
#: What the API shows instead of a secret env value.
SECRET_MASK = "***"
MAX_NODES = 128
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Set by the runtime for each assignment: a workload may not choose its own GPUs or identity.
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
RESERVED_ENV_PREFIX = "GPUFED_"
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

GpuModel = Annotated[str, StringConstraints(pattern=GPU_MODEL_PATTERN, max_length=63)]


class Phase(StrEnum):
    """Lifecycle of a workload as the hub records it."""

    QUEUED = "queued"
    PLACED = "placed"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL

    @property
    def active(self) -> bool:
        """Holds GPUs (or is about to)."""
        return self in _ACTIVE


# Sets made once: the store reads `terminal` for every row it saves, and a tuple built on
# each call cost ten times the lookup.
_TERMINAL = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED})
_ACTIVE = frozenset({Phase.PLACED, Phase.RUNNING})


class WorkloadKind(StrEnum):
    """What a workload is for: a job runs to completion; a session (a notebook, a shell) and a
    service (an inference server) listen on a port the spoke exposes and reports as a URL."""

    JOB = "job"
    SESSION = "session"
    SERVICE = "service"

    @property
    def exposes_port(self) -> bool:
        """Whether its runtime gives it a port ($GPUFED_PORT) and reports its URL."""
        return self is not WorkloadKind.JOB


#: The priority class a session gets when its spec names none.
SESSION_PRIORITY_CLASS = "dev"


class RestartPolicy(StrEnum):
    """What happens when the spoke running a workload is lost or the workload fails."""

    NEVER = "never"
    ON_FAILURE = "on_failure"


class HubLoss(StrEnum):
    """What its spoke does with a workload when it stops hearing the hub (execution fencing).

    `auto`: stop it when the hub would run it elsewhere (restart_policy on_failure), so it never
    runs twice; keep it otherwise. `stop`: always stop it. `keep`: never stop it; the hub then
    never moves it either, and waits for its spoke to come back instead.
    """

    AUTO = "auto"
    STOP = "stop"
    KEEP = "keep"


def accept_secret_values(data: Any) -> Any:
    """`env: {HF_TOKEN: {value: "...", secret: true}}` marks one value secret in place: the
    value goes into env and its name into secret_env (for any spec with those two fields)."""
    if not isinstance(data, dict) or not isinstance(data.get("env"), dict):
        return data
    env = data["env"]
    if not any(isinstance(v, dict) for v in env.values()):
        return data
    plain: dict[str, Any] = {}
    secret = list(data.get("secret_env") or ())
    for key, value in env.items():
        if isinstance(value, dict) and set(value) <= {"value", "secret"} and "value" in value:
            plain[key] = value["value"]
            if value.get("secret") is True and key not in secret:
                secret.append(key)
        else:
            plain[key] = value
    return {**data, "env": plain, "secret_env": secret}


class Affinity(WireModel):
    """Where a workload may (required) or would rather (preferred) run."""

    model_config = KEEPS_UNKNOWN

    required_regions: tuple[DnsLabel, ...] = ()
    preferred_regions: tuple[DnsLabel, ...] = ()
    required_labels: dict[str, str] = Field(default_factory=dict)
    preferred_labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("required_labels", "preferred_labels")
    @classmethod
    def _label_keys(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 32:
            raise ValueError("at most 32 labels")
        for key, val in value.items():
            if not LABEL_KEY.match(key) or len(key) > 253:
                raise ValueError(f"label key {key!r} is not a valid label name")
            if len(val) > 63:
                raise ValueError(f"label {key!r}: value longer than 63 characters")
        return value


class WorkloadSpec(WireModel):
    """A unit of work: one command run on `nodes` x `gpus_per_node` GPUs (a gang when nodes > 1)."""

    model_config = KEEPS_UNKNOWN

    name: DnsLabel
    team: DnsLabel
    kind: WorkloadKind = Field(
        default=WorkloadKind.JOB,
        description="job (runs to completion), session or service (listen on $GPUFED_PORT; "
        "the spoke reports their URL). A session's priority_class defaults to dev.",
    )
    priority_class: DnsLabel = "batch"
    command: tuple[str, ...] = Field(min_length=1, max_length=MAX_COMMAND_ITEMS)
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of the command. A value may also be given as "
        "{value: ..., secret: true}: it is then listed in secret_env.",
    )
    secret_env: tuple[str, ...] = Field(
        default=(),
        max_length=MAX_ENV_ENTRIES,
        description="Names of env entries whose values are secret: the API shows them as "
        f"{SECRET_MASK!r} and they are never logged.",
    )
    image: str | None = Field(
        default=None,
        max_length=512,
        description="Container image (Kubernetes runtime); the local runtime runs on the host.",
    )
    working_dir: str | None = Field(default=None, max_length=4096)
    gpus_per_node: int = Field(default=1, ge=1, le=MAX_GPUS_PER_NODE)
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    gpu_models: tuple[GpuModel, ...] = Field(
        default=(),
        max_length=16,
        description="Acceptable GPU models, most preferred first; empty means any.",
    )
    gpu_fraction: float | None = Field(
        default=None, gt=0, lt=1, description="Share of one GPU; only with 1 GPU on 1 node."
    )
    affinity: Affinity = Field(default_factory=Affinity)
    max_runtime_s: int | None = Field(default=None, gt=0, le=90 * 24 * 3600)
    restart_policy: RestartPolicy = RestartPolicy.NEVER
    max_restarts: int = Field(default=3, ge=0, le=100)
    on_hub_loss: HubLoss = HubLoss.AUTO

    @property
    def fenced(self) -> bool:
        """Whether its spoke stops it once it has not heard the hub for fence_after."""
        if self.on_hub_loss == HubLoss.AUTO:
            return self.restart_policy == RestartPolicy.ON_FAILURE
        return self.on_hub_loss == HubLoss.STOP

    @property
    def moved_when_spoke_lost(self) -> bool:
        """Whether the hub reruns it elsewhere when its spoke is declared lost."""
        return self.restart_policy == RestartPolicy.ON_FAILURE and self.on_hub_loss != HubLoss.KEEP

    @model_validator(mode="before")
    @classmethod
    def _session_class(cls, data: Any) -> Any:
        # A notebook is interactive work: `dev` unless the user asks for another class.
        if (
            isinstance(data, dict)
            and data.get("kind") == WorkloadKind.SESSION.value
            and data.get("priority_class") is None
        ):
            return {**data, "priority_class": SESSION_PRIORITY_CLASS}
        return data

    @model_validator(mode="before")
    @classmethod
    def _accept_single_model(cls, data: Any) -> Any:
        # `gpu_model: "H100"` is the common case; accept it beside the list form.
        if isinstance(data, dict) and "gpu_model" in data:
            data = dict(data)
            model = data.pop("gpu_model")
            if "gpu_models" in data:
                raise ValueError("give gpu_model or gpu_models, not both")
            data["gpu_models"] = [model] if isinstance(model, str) else model
        return data

    @model_validator(mode="before")
    @classmethod
    def _accept_secret_values(cls, data: Any) -> Any:
        return accept_secret_values(data)

    @field_validator("command")
    @classmethod
    def _command_size(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value[0]:
            raise ValueError("the program (first item) must not be empty")
        for index, part in enumerate(value):
            try:
                refuse_control(part)
            except ValueError as exc:
                raise ValueError(f"item {index} {exc}") from None
        if sum(len(part.encode()) for part in value) > MAX_COMMAND_BYTES:
            raise ValueError(f"command longer than {MAX_COMMAND_BYTES} bytes")
        return value

    @field_validator("env")
    @classmethod
    def _env_size(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > MAX_ENV_ENTRIES:
            raise ValueError(f"at most {MAX_ENV_ENTRIES} variables")
        for key, val in value.items():
            if not ENV_KEY.match(key):
                raise ValueError(f"{key!r} is not a valid environment variable name")
            if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(
                    f"{key} is set by gpufed for the GPUs it assigns; a workload cannot set it"
                )
            try:
                refuse_control(val)
            except ValueError as exc:
                raise ValueError(f"{key} {exc}") from None
        if sum(len(k.encode()) + len(v.encode()) for k, v in value.items()) > MAX_ENV_BYTES:
            raise ValueError(f"environment larger than {MAX_ENV_BYTES} bytes")
        return value

    @field_validator("image", "working_dir")
    @classmethod
    def _no_control(cls, value: str | None) -> str | None:
        return None if value is None else refuse_control(value)

    @model_validator(mode="after")
    def _fraction_only_alone(self) -> WorkloadSpec:
        if self.gpu_fraction is not None and (self.gpus_per_node != 1 or self.nodes != 1):
            raise ValueError("gpu_fraction needs gpus_per_node=1 and nodes=1")
        unknown = [name for name in self.secret_env if name not in self.env]
        if unknown:
            raise ValueError(f"secret_env names {unknown[0]!r}, which env does not set")
        return self

    def redacted(self) -> WorkloadSpec:
        """This spec with every secret env value replaced by SECRET_MASK (for showing back)."""
        if not self.secret_env:
            return self
        secret = set(self.secret_env)
        env = {k: (SECRET_MASK if k in secret else v) for k, v in self.env.items()}
        return self.model_copy(update={"env": env})

    @property
    def total_gpus(self) -> float:
        """GPUs the workload holds while it runs (a fraction counts as its share)."""
        if self.gpu_fraction is not None:
            return self.gpu_fraction
        return float(self.gpus_per_node * self.nodes)


#: A workload spec's parts whose fields are checked (`unknown_fields`, `spec_problems`).
SPEC_PARTS: SpecParts = (("", WorkloadSpec), ("affinity.", Affinity))


def unknown_fields(spec: WorkloadSpec) -> list[tuple[str, str | None]]:
    """The fields a submitter named that a spec does not have (`affinity.`-prefixed inside
    it), each with the nearest one it has, if any: the hub refuses such a spec rather than run
    something other than what was asked. Empty for a spec without any."""
    return extra_fields(spec, SPEC_PARTS)


def spec_problems(errors: Sequence[Mapping[str, Any]], data: object) -> tuple[str | None, str]:
    """Why submitted `data` is no spec, its unknown fields first (`problems_unknown_first`; a
    valid spec's unknown fields are `unknown_fields`)."""
    return problems_unknown_first(errors, data, SPEC_PARTS)


class SubmitReply(WireModel):
    """Answer to a submission: the new workload's id, or an error."""

    ok: bool
    workload_id: Identifier | None = None
    error: ErrorReply | None = None


#: Most workloads one batch submission may hold.
MAX_BATCH = 10_000


class SubmitBatchReply(WireModel):
    """Answer to a batch submission: one SubmitReply per spec, in order; or why none was taken.

    `error` is set (and `results` empty) when the batch as a whole was refused (too many specs,
    not a list); otherwise each spec stands or falls alone.
    """

    results: tuple[SubmitReply, ...] = ()
    accepted: int = 0
    refused: int = 0
    error: ErrorReply | None = None

    def encode(self, limit: int) -> bytes:
        """This reply as JSON, in at most `limit` bytes where it can be (a NATS message's
        `max_payload`: a reply over it is never sent, and its sender, whose work was taken,
        hears nothing). Fields at their defaults are left out; while still over, a refusal
        said by an earlier item says so instead (`as item 3`: the code and the field stay),
        then every message is cut short, then left empty. Each item keeps whether it was taken,
        its workload id, and its error's code and field."""
        reply, data = self, self._json()
        for shorten in (_said_before, _cut(120), _cut(0)):
            if len(data) <= limit:
                break
            reply = reply.model_copy(update={"results": shorten(reply.results)})
            data = reply._json()
        return data

    def _json(self) -> bytes:
        return self.model_dump_json(exclude_defaults=True).encode()


def _said_before(results: tuple[SubmitReply, ...]) -> tuple[SubmitReply, ...]:
    """`results` with each error an earlier item gave word for word pointing to that item."""
    first: dict[tuple[str, str, str | None], int] = {}
    out: list[SubmitReply] = []
    for at, reply in enumerate(results):
        error = reply.error
        if error is not None:
            said = first.setdefault((error.code, error.message, error.field), at)
            if said != at:
                reply = reply.model_copy(
                    update={"error": error.model_copy(update={"message": f"as item {said}"})}
                )
        out.append(reply)
    return tuple(out)


def _cut(most: int) -> Callable[[tuple[SubmitReply, ...]], tuple[SubmitReply, ...]]:
    """What cuts every error's message in `results` to at most `most` characters."""

    def cut(results: tuple[SubmitReply, ...]) -> tuple[SubmitReply, ...]:
        return tuple(
            r
            if r.error is None or len(r.error.message) <= most
            else r.model_copy(
                update={"error": r.error.model_copy(update={"message": r.error.message[:most]})}
            )
            for r in results
        )

    return cut
