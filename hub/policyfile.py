"""Read and write the scheduling policy as YAML or JSON.

The file format (docs/policy.md has the full story)::

    priority_classes:            # optional; the defaults below when left out
      - {name: production, value: 1000, preemptible: false, may_borrow: false}
      - {name: training, value: 500}
      - {name: dev, value: 300}
      - {name: batch, value: 100}
    departments:
      - name: research
        quotas: {H100: {guaranteed: 32, limit: 64}}
    teams:
      - name: vision
        department: research
        weight: 2
        may_burst: true
        max_queued: 2000                      # more queued at once: 429
        burst_budget: {dollars_per_hour: 40, dollars_per_month: 5000}
        quotas:
          H100: {guaranteed: 16, limit: 32}   # limit left out: no cap beyond what is idle
          "*": {guaranteed: 0, limit: 8}      # every model not listed
    default_team: {may_burst: false, max_queued: 5000}   # teams not listed
    aging: {interval_s: 900, step: 25}
    windows:                                 # changes on a weekly schedule; first in force wins
      - name: workday
        timezone: Europe/Berlin
        days: weekdays                       # or [mon, tue, ...], weekends, daily
        start: "08:00"                       # quote times: YAML reads 20:00 as a number
        end: "20:00"                         # an end not after start runs past midnight
        priority_classes: {dev: {value: 600}}
        teams: {vision: {quotas: {H100: {guaranteed: 4}}}}   # model by model
        departments: {research: {quotas: {H100: {guaranteed: 40}}}}
    burst: {dollars_per_hour: 50}            # all burst instances together
    sessions: {idle_after: 30m, max_lifetime: 12h}       # hub.idlepolicy
    idle: {util_percent: 5, flag_after: 10m, reclaim_after: 1h, classes: [dev]}

Anything wrong raises `PolicyError` naming the field, e.g.
``teams[vision].quotas[H100].limit: 8 is below the guaranteed 16``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml
from pydantic import (
    BeforeValidator,
    Field,
    StringConstraints,
    ValidationError,
)

from hub.core import gpumodels
from hub.core.policy import (
    DEFAULT_BURST_DOLLARS_PER_HOUR,
    DEFAULT_CLASSES,
    DEFAULT_MAX_QUEUED,
    MAX_AGING_INTERVAL_S,
    MAX_GPUS,
    MAX_PRIORITY,
    MAX_WEIGHT,
    MIN_AGING_INTERVAL_S,
    MIN_WEIGHT,
    Aging,
    BurstBudget,
    ClassChange,
    Consolidation,
    Department,
    Ordering,
    Policy,
    PriorityClass,
    Quota,
    Reservation,
    Team,
    TeamChange,
    Window,
    check_policy,
)
from hub.core.windows import check_windows
from hub.idlepolicy import (
    IdleDoc,
    SessionsDoc,
    idle_dict,
    idle_rules,
    session_rules,
    sessions_dict,
)
from hub.policyclock import DAYS, ClockTime, DayName, clock, day_list, seconds
from schemas.common import DNS_LABEL_PATTERN, StrictDoc
from schemas.errors import problem_sentence

FORMAT_VERSION = 1


class PolicyError(ValueError):
    """The policy text is not a valid policy; the message names the field at fault."""


def load_policy(text: str) -> Policy:
    """Parse a policy from YAML (JSON is YAML too)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PolicyError(f"policy is not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError("policy: expected a mapping at the top level")
    return policy_from_dict(data)


def policy_from_dict(data: dict[str, Any]) -> Policy:
    """Build and check a policy from its dict form (as `policy_to_dict` writes it)."""
    policy = _built(data)
    return _checked(policy, gpumodels.clashes(policy))


def restored_policy(data: dict[str, Any], known: Mapping[str, str]) -> tuple[Policy, list[str]]:
    """`policy_from_dict` for the policy the store holds, and a note of each quota dropped.

    An older hub stored a policy that names one model twice in a mapping (`H100` beside
    `h100`); refused, it would keep the hub from starting. Such quotas are settled as that hub
    had them in force (`gpumodels.settle`, by the fleet's spellings `known`) instead.
    """
    policy, dropped = gpumodels.settle(_built(data), known)
    return _checked(policy, []), dropped


def _built(data: dict[str, Any]) -> Policy:
    try:
        doc = _PolicyDoc.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(describe_errors(exc.errors(), data)) from exc
    if doc.version != FORMAT_VERSION:
        raise PolicyError(f"version: this hub reads policy version {FORMAT_VERSION}")
    default = doc.default_team
    thresholds = tuple(doc.ordering.thresholds_gpu_s)
    return Policy(
        classes=(
            tuple(
                PriorityClass(c.name, c.value, c.preemptible, c.may_borrow)
                for c in doc.priority_classes
            )
            if doc.priority_classes is not None
            else DEFAULT_CLASSES
        ),
        teams=tuple(
            Team(
                t.name,
                t.department,
                _quotas(t.quotas),
                t.weight,
                t.may_burst,
                t.max_queued,
                t.burst_budget.dollars_per_hour,
                t.burst_budget.dollars_per_month,
            )
            for t in doc.teams
        ),
        departments=tuple(Department(d.name, _quotas(d.quotas)) for d in doc.departments),
        default_team=Team(
            "*",
            None,
            _quotas(default.quotas),
            default.weight,
            default.may_burst,
            default.max_queued,
        ),
        aging=Aging(doc.aging.interval_s, doc.aging.step),
        windows=tuple(_window(w) for w in doc.windows),
        reservation=Reservation(
            doc.reservation.min_gpus, doc.reservation.after_s, doc.reservation.max_gangs
        ),
        ordering=Ordering(**(doc.ordering.model_dump() | {"thresholds_gpu_s": thresholds})),
        burst=BurstBudget(doc.burst.dollars_per_hour),
        sessions=session_rules(doc.sessions),
        idle=idle_rules(doc.idle),
        consolidation=Consolidation(**doc.consolidation.model_dump()),
    )


def _checked(policy: Policy, problems: list[str]) -> Policy:
    """`policy` with one spelling for each model, once it and its windows pass their checks;
    PolicyError names every problem, with the `problems` found before."""
    # One spelling per model before anything adds quotas up or applies a window: a
    # department's `H100` guarantee holds its teams' `h100` ones, a window's `h100` changes
    # the teams' `H100` quota.
    policy = gpumodels.one_spelling(policy)
    problems = problems + check_policy(policy) + check_windows(policy)
    if problems:
        raise PolicyError("; ".join(problems))
    return policy


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The dict form of `policy`: JSON- and YAML-safe, and read back by `policy_from_dict`."""
    thresholds = policy.ordering.thresholds_gpu_s
    return {
        "version": FORMAT_VERSION,
        "priority_classes": [
            {
                "name": c.name,
                "value": c.value,
                "preemptible": c.preemptible,
                "may_borrow": c.may_borrow,
            }
            for c in policy.classes
        ],
        "departments": [
            {"name": d.name, "quotas": _quotas_dict(d.quotas)} for d in policy.departments
        ],
        "teams": [
            {
                "name": t.name,
                "department": t.department,
                "weight": t.weight,
                "may_burst": t.may_burst,
                "max_queued": t.max_queued,
                "burst_budget": {
                    "dollars_per_hour": t.burst_dollars_per_hour,
                    "dollars_per_month": t.burst_dollars_per_month,
                },
                "quotas": _quotas_dict(t.quotas),
            }
            for t in policy.teams
        ],
        "default_team": {
            "weight": policy.default_team.weight,
            "may_burst": policy.default_team.may_burst,
            "max_queued": policy.default_team.max_queued,
            "quotas": _quotas_dict(policy.default_team.quotas),
        },
        "aging": {"interval_s": policy.aging.interval_s, "step": policy.aging.step},
        "windows": [_window_dict(w) for w in policy.windows],
        "reservation": {
            "min_gpus": policy.reservation.min_gpus,
            "after_s": policy.reservation.after_s,
            "max_gangs": policy.reservation.max_gangs,
        },
        "ordering": asdict(policy.ordering) | {"thresholds_gpu_s": list(thresholds)},
        "consolidation": asdict(policy.consolidation),
        "burst": {"dollars_per_hour": policy.burst.dollars_per_hour},
        "sessions": sessions_dict(policy.sessions),
        "idle": idle_dict(policy.idle),
    }


def dump_policy(policy: Policy, fmt: str = "yaml") -> str:
    """The policy as YAML or JSON text."""
    data = policy_to_dict(policy)
    if fmt == "json":
        return json.dumps(data, indent=2)
    return str(yaml.safe_dump(data, sort_keys=False))


class _Doc(StrictDoc):
    """Every part of the document: see StrictDoc."""


class _QuotaDoc(_Doc):
    guaranteed: float = Field(default=0.0, ge=0, le=MAX_GPUS)
    limit: float | None = Field(default=None, ge=0, le=MAX_GPUS)


# A GPU model name, or "*" for every model not listed.
ModelKey = Annotated[str, StringConstraints(pattern=r"^(\*|[A-Za-z0-9][A-Za-z0-9_.-]{0,62})$")]


class _ClassDoc(_Doc):
    name: str = Field(pattern=DNS_LABEL_PATTERN)
    value: int = Field(ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    preemptible: bool = True
    may_borrow: bool = True


class _DepartmentDoc(_Doc):
    name: str = Field(pattern=DNS_LABEL_PATTERN)
    quotas: dict[ModelKey, _QuotaDoc] = Field(default_factory=dict)


class _DefaultTeamDoc(_Doc):
    weight: float = Field(default=1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT)
    may_burst: bool = False
    max_queued: int | None = Field(default=DEFAULT_MAX_QUEUED, ge=0)
    quotas: dict[ModelKey, _QuotaDoc] = Field(default_factory=dict)


class _TeamBurstDoc(_Doc):
    dollars_per_hour: float | None = Field(default=None, ge=0)
    dollars_per_month: float | None = Field(default=None, ge=0)


class _TeamDoc(_Doc):
    name: str = Field(pattern=DNS_LABEL_PATTERN)
    department: str | None = None
    weight: float = Field(default=1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT)
    may_burst: bool = False
    max_queued: int | None = Field(default=None, ge=0)
    burst_budget: _TeamBurstDoc = Field(default_factory=_TeamBurstDoc)
    quotas: dict[ModelKey, _QuotaDoc] = Field(default_factory=dict)


class _BurstDoc(_Doc):
    dollars_per_hour: float | None = Field(default=DEFAULT_BURST_DOLLARS_PER_HOUR, ge=0)


class _AgingDoc(_Doc):
    interval_s: float = Field(default=900.0, ge=MIN_AGING_INTERVAL_S, le=MAX_AGING_INTERVAL_S)
    step: int = Field(default=25, ge=0, le=MAX_PRIORITY)


class _ClassChangeDoc(_Doc):
    value: int | None = None
    preemptible: bool | None = None
    may_borrow: bool | None = None


class _TeamChangeDoc(_Doc):
    weight: float | None = Field(default=None, gt=0)
    may_burst: bool | None = None
    quotas: dict[ModelKey, _QuotaDoc] = Field(default_factory=dict)


class _DepartmentChangeDoc(_Doc):
    quotas: dict[ModelKey, _QuotaDoc] = Field(default_factory=dict)


class _WindowDoc(_Doc):
    name: str = Field(pattern=DNS_LABEL_PATTERN)
    timezone: str = "UTC"
    days: Annotated[list[DayName], BeforeValidator(day_list)] = Field(
        default_factory=lambda: list(DAYS)
    )
    start: ClockTime = "00:00"
    end: ClockTime = "24:00"
    priority_classes: dict[str, _ClassChangeDoc] = Field(default_factory=dict)
    teams: dict[str, _TeamChangeDoc] = Field(default_factory=dict)
    departments: dict[str, _DepartmentChangeDoc] = Field(default_factory=dict)
    default_team: _TeamChangeDoc | None = None


class _ReservationDoc(_Doc):
    min_gpus: int = Field(default=0, ge=0)
    after_s: float = Field(default=1800.0, ge=0)
    max_gangs: int = Field(default=1, ge=0)


class _OrderingDoc(_Doc):
    mode: Literal["fifo", "las"] = "fifo"
    thresholds_gpu_s: list[float] = Field(default_factory=lambda: [3600.0], max_length=16)
    promote_knob: float = Field(default=8.0, ge=0)
    exempt_gpus: int = Field(default=32, ge=0)
    min_run_s: float = Field(default=0.0, ge=0)
    patience_s: float = Field(default=0.0, ge=0)
    resumed_min_run_s: float = Field(default=0.0, ge=0)


class _ConsolidationDoc(_Doc):
    enabled: bool = False
    after_s: float = Field(default=7200.0, ge=0)
    max_per_cycle: int = Field(default=4, ge=0)


class _PolicyDoc(_Doc):
    version: int = FORMAT_VERSION
    priority_classes: list[_ClassDoc] | None = Field(default=None, max_length=64)
    departments: list[_DepartmentDoc] = Field(default_factory=list, max_length=10_000)
    teams: list[_TeamDoc] = Field(default_factory=list, max_length=100_000)
    default_team: _DefaultTeamDoc = Field(default_factory=_DefaultTeamDoc)
    aging: _AgingDoc = Field(default_factory=_AgingDoc)
    windows: list[_WindowDoc] = Field(default_factory=list)
    reservation: _ReservationDoc = Field(default_factory=_ReservationDoc)
    ordering: _OrderingDoc = Field(default_factory=_OrderingDoc)
    consolidation: _ConsolidationDoc = Field(default_factory=_ConsolidationDoc)
    burst: _BurstDoc = Field(default_factory=_BurstDoc)
    sessions: SessionsDoc = Field(default_factory=SessionsDoc)
    idle: IdleDoc = Field(default_factory=IdleDoc)


#: The policy document as the REST API takes it (its JSON Schema is in /openapi.json).
PolicyDocument = _PolicyDoc


def _window(doc: _WindowDoc) -> Window:
    try:
        zone = ZoneInfo(doc.timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise PolicyError(
            f"windows[{doc.name}].timezone: unknown time zone {doc.timezone!r} "
            "(an IANA name such as Europe/Berlin)"
        ) from exc
    return Window(
        name=doc.name,
        zone=zone,
        timezone=doc.timezone,
        days=frozenset(DAYS.index(d) for d in doc.days),
        start_s=seconds(doc.start),
        end_s=seconds(doc.end),
        classes={
            name: ClassChange(c.value, c.preemptible, c.may_borrow)
            for name, c in doc.priority_classes.items()
        },
        teams={name: _team_change(t) for name, t in doc.teams.items()},
        departments={name: _quotas(d.quotas) for name, d in doc.departments.items()},
        default_team=_team_change(doc.default_team) if doc.default_team is not None else None,
    )


def _team_change(doc: _TeamChangeDoc) -> TeamChange:
    return TeamChange(_quotas(doc.quotas), doc.weight, doc.may_burst)


def _window_dict(w: Window) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": w.name,
        "timezone": w.timezone,
        "days": [d for i, d in enumerate(DAYS) if i in w.days],
        "start": clock(w.start_s),
        "end": clock(w.end_s),
        "priority_classes": {
            name: {k: v for k, v in _class_change_items(c) if v is not None}
            for name, c in w.classes.items()
        },
        "teams": {name: _team_change_dict(t) for name, t in w.teams.items()},
        "departments": {name: {"quotas": _quotas_dict(q)} for name, q in w.departments.items()},
    }
    if w.default_team is not None:
        data["default_team"] = _team_change_dict(w.default_team)
    return data


def _class_change_items(c: ClassChange) -> list[tuple[str, Any]]:
    return [("value", c.value), ("preemptible", c.preemptible), ("may_borrow", c.may_borrow)]


def _team_change_dict(t: TeamChange) -> dict[str, Any]:
    data: dict[str, Any] = {"quotas": _quotas_dict(t.quotas)}
    if t.weight is not None:
        data["weight"] = t.weight
    if t.may_burst is not None:
        data["may_burst"] = t.may_burst
    return data


def _quotas(quotas: dict[str, _QuotaDoc]) -> dict[str, Quota]:
    return {model: Quota(q.guaranteed, q.limit) for model, q in quotas.items()}


def _quotas_dict(quotas: Mapping[str, Quota]) -> dict[str, dict[str, float | None]]:
    return {model: {"guaranteed": q.guaranteed, "limit": q.limit} for model, q in quotas.items()}


def describe_errors(errors: Sequence[Mapping[str, Any]], data: Any) -> str:
    """Pydantic's errors about policy `data` as 'teams[vision].quotas[H100].guaranteed:
    message', joined: list items by their name, as the rest of the checks write them."""
    parts = []
    for error in errors:
        loc = tuple(error["loc"])
        path = ""
        for at, item in enumerate(loc):
            if item == "[key]":
                continue
            if isinstance(item, int):
                path += f"[{_name_at(data, loc[:at], item)}]"
            elif path.endswith("quotas"):
                path += f"[{item}]"
            else:
                path += f".{item}" if path else str(item)
        parts.append(f"{path or 'policy'}: {problem_sentence(error)}")
    return "; ".join(parts)


def _name_at(data: Any, loc: tuple[int | str, ...], index: int) -> str:
    """The `name` of list item `index` under `loc`, or the index when it has none."""
    for key in loc:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return str(index)
    try:
        name = data[index].get("name")
    except (IndexError, TypeError, AttributeError):
        return str(index)
    return str(name) if isinstance(name, str) and name else str(index)
