"""Plain models of what the hub keeps: the rest of the hub sees these, never the tables."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, PrivateAttr, computed_field

from hub.core.lifecycle import Attempt, Lifecycle, RetryRules, live_attempt
from schemas import Assignment, CapacityReport, Phase, RestartPolicy, WorkloadSpec


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    """One thing that happened to a workload (kept across requeues).

    A dataclass, not a model: the hub writes four or more per workload, and a model validated
    each on construction; pydantic still checks each one it reads (a stored record, a reply).
    """

    at: float
    event: str
    epoch: int = 0
    spoke_id: str | None = None
    detail: str = ""


class WorkloadRecord(BaseModel):
    """A workload as the hub tracks it: its lifecycle (`hub.core.lifecycle`) and what it is for.

    `attempts` keeps every placement (the store keeps them in their own table); the fields of
    the current attempt (`epoch`, `spoke_id`, `assignments`, `placed_at`, ...) are read from it:
    the live attempt's, or the last one's once the workload ended, or none while it is queued.
    """

    id: str
    spec: WorkloadSpec
    phase: Phase = Phase.QUEUED
    attempts: tuple[Attempt, ...] = ()
    submitted_at: float
    user: str = ""  # who submitted it, where the API knows (usage by user)
    finished_at: float | None = None
    reason: str = ""
    message: str = ""
    restarts: int = 0
    cancel_requested: bool = False
    # Why the hub stopped it itself (hub.idle: an EndReason value) and the notice it gave.
    stop_reason: str = ""
    stop_notice: str = ""
    # Spokes whose runtime refused it for good: placement never sends it back to them.
    rejected_by: list[str] = Field(default_factory=list)  # replaced, never appended to
    history: list[HistoryEntry] = Field(default_factory=list)
    # The ids of moved records of the `Records` that holds it, told when it moves.
    _watch: set[str] | None = PrivateAttr(default=None)

    def __setattr__(self, name: str, value: Any) -> None:
        """A field is written as pydantic writes one of a model without validate_assignment
        (into the instance, noted as set), without its three calls and two lookups: the hub
        writes a dozen a workload. Anything else (`lifecycle`, an unknown name) as pydantic.
        A field the scheduling cycle's views are made of tells the `Records` that holds it."""
        if name in _FIELDS:
            self.__dict__[name] = value
            self.__pydantic_fields_set__.add(name)
            if name in _VIEWED:
                self._tell()
        elif name == "lifecycle":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    @property
    def lifecycle(self) -> Lifecycle:
        """Its place in the lifecycle, as the core moves it."""
        return Lifecycle(self.phase, self.attempts, self.restarts)

    @lifecycle.setter
    def lifecycle(self, lc: Lifecycle) -> None:
        fields = self.__dict__
        fields["phase"], fields["attempts"], fields["restarts"] = lc.phase, lc.attempts, lc.restarts
        self.__pydantic_fields_set__.update(_MOVED)
        self._tell()

    def watch(self, moved: set[str] | None) -> None:
        """Add its id to `moved` whenever it moves (None: to none)."""
        private = self.__pydantic_private__
        assert private is not None  # a model with a private attribute always has the dict
        private["_watch"] = moved

    def _tell(self) -> None:
        private = self.__pydantic_private__
        watch = private.get("_watch") if private is not None else None
        if watch is not None:
            watch.add(self.id)

    @property
    def live(self) -> Attempt | None:
        """The live attempt (`Lifecycle.live`, without building the lifecycle)."""
        return live_attempt(self.attempts)

    @property
    def retry_rules(self) -> RetryRules:
        """What its spec and the user allow when an attempt ends."""
        return RetryRules(
            on_failure=self.spec.restart_policy == RestartPolicy.ON_FAILURE,
            max_restarts=self.spec.max_restarts,
            cancel_requested=self.cancel_requested,
        )

    @property
    def current(self) -> Attempt | None:
        """The live attempt; the last one once ended; None while queued."""
        if not self.attempts or self.phase == Phase.QUEUED:
            return None
        return self.attempts[-1]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def epoch(self) -> int:
        """The latest attempt's epoch: commands and events of any other are ignored."""
        return self.attempts[-1].epoch if self.attempts else 0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def spoke_id(self) -> str | None:
        return self.current.spoke_id if self.current else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def assignments(self) -> tuple[Assignment, ...]:
        return self.current.assignments if self.current else ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def placed_at(self) -> float | None:
        return self.current.placed_at if self.current else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def started_at(self) -> float | None:
        return self.current.started_at if self.current else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def endpoint(self) -> str | None:
        """A running session's or service's URL, as its spoke reported it."""
        live = self.live
        return live.endpoint if live is not None and self.phase == Phase.RUNNING else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exit_code(self) -> int | None:
        """The exit code of the latest attempt that reported one."""
        for attempt in reversed(self.attempts):
            if attempt.exit_code is not None:
                return attempt.exit_code
        return None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def preempting(self) -> bool:
        live = self.live
        return live is not None and live.preempting

    @computed_field  # type: ignore[prop-decorator]
    @property
    def preempted_for(self) -> str | None:
        """The pending workload its live attempt is being stopped for."""
        live = self.live
        return live.preempted_for if live else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def command_seq(self) -> int | None:
        """Command stream sequence of the live attempt's Place."""
        live = self.live
        return live.command_seq if live else None

    def note(self, at: float, event: str, detail: str = "") -> None:
        """Append to the history (the API shows it; requeues keep it), with the current
        attempt's epoch and spoke (`epoch`, `spoke_id`: read here without their properties)."""
        attempts = self.attempts
        if not attempts:
            self.history.append(HistoryEntry(at, event, 0, None, detail))
            return
        last = attempts[-1]
        spoke = None if self.phase == Phase.QUEUED else last.spoke_id
        self.history.append(HistoryEntry(at, event, last.epoch, spoke, detail))


#: What `WorkloadRecord.__setattr__` writes straight in, and what a lifecycle move sets.
_FIELDS = frozenset(WorkloadRecord.model_fields)
_MOVED = ("phase", "attempts", "restarts")
#: The fields the cycle's views of a record are made of (`hub.cycle`): writing one moves it.
_VIEWED = frozenset({"id", "spec", "submitted_at", "rejected_by", *_MOVED})


class Records(dict[str, WorkloadRecord]):
    """The hub's non-terminal workloads by id, and which of them moved since the scheduling
    cycle last looked (`take_moved`): each added, removed or replaced, and each whose record
    says it moved (`WorkloadRecord.watch`). So a cycle reads what changed, not every record.
    """

    def __init__(self, records: Iterable[WorkloadRecord] = ()) -> None:
        super().__init__()
        self.moved: set[str] = set()
        for record in records:
            self[record.id] = record

    def __setitem__(self, workload_id: str, record: WorkloadRecord) -> None:
        old = self.get(workload_id)
        if old is not None and old is not record:
            old.watch(None)
        record.watch(self.moved)
        self.moved.add(workload_id)
        super().__setitem__(workload_id, record)

    def __delitem__(self, workload_id: str) -> None:
        self[workload_id].watch(None)
        self.moved.add(workload_id)
        super().__delitem__(workload_id)

    def pop(self, workload_id: str, *default: Any) -> Any:
        if workload_id not in self:
            return super().pop(workload_id, *default)  # the default, or KeyError
        record = self[workload_id]
        del self[workload_id]
        return record

    def update(self, *args: Any, **kwargs: Any) -> None:
        for workload_id, record in dict(*args, **kwargs).items():
            self[workload_id] = record

    def setdefault(self, workload_id: str, record: WorkloadRecord) -> WorkloadRecord:
        if workload_id not in self:
            self[workload_id] = record
        return self[workload_id]

    def popitem(self) -> tuple[str, WorkloadRecord]:
        workload_id = next(reversed(self))
        return workload_id, self.pop(workload_id)

    def clear(self) -> None:
        for workload_id in list(self):
            del self[workload_id]

    def take_moved(self) -> set[str]:
        """The ids moved since the last call (the records keep telling the same set)."""
        moved = set(self.moved)
        self.moved.clear()
        return moved


class DecisionRecord(BaseModel):
    """A command the hub decided to send; kept until the bus has acknowledged it."""

    decision_id: str
    workload_id: str
    spoke_id: str
    subject: str
    payload: bytes
    created_at: float
    published: bool = False


class Cordon(BaseModel):
    """Who took a spoke out of placement, when, and why (`hub.cordons`)."""

    by: str
    at: float
    reason: str = Field(default="", max_length=256)


class SpokeRecord(BaseModel):
    """A spoke as last heard of."""

    id: str
    region: str
    kind: str
    first_seen: float
    last_seen: float
    lost_at: float | None = None  # declared lost (its work was moved); cleared when it returns
    report: CapacityReport | None = None
