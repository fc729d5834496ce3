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
        quotas:
          H100: {guaranteed: 16, limit: 32}   # limit left out: no cap beyond what is idle
          "*": {guaranteed: 0, limit: 8}      # every model not listed
    default_team: {may_burst: false}         # teams not listed
    aging: {interval_s: 900, step: 25}

Anything wrong raises `PolicyError` naming the field, e.g.
``teams[vision].quotas[H100].limit: 8 is below the guaranteed 16``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from hub.core.policy import (
    DEFAULT_CLASSES,
    MAX_AGING_INTERVAL_S,
    MAX_GPUS,
    MAX_PRIORITY,
    MAX_WEIGHT,
    MIN_AGING_INTERVAL_S,
    MIN_WEIGHT,
    Aging,
    Department,
    Policy,
    PriorityClass,
    Quota,
    Team,
    check_policy,
)
from schemas.common import DNS_LABEL_PATTERN

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
    try:
        doc = _PolicyDoc.model_validate(data)
    except ValidationError as exc:
        raise PolicyError(_describe(exc, data)) from exc
    if doc.version != FORMAT_VERSION:
        raise PolicyError(f"version: this hub reads policy version {FORMAT_VERSION}")
    default = doc.default_team
    policy = Policy(
        classes=(
            tuple(
                PriorityClass(c.name, c.value, c.preemptible, c.may_borrow)
                for c in doc.priority_classes
            )
            if doc.priority_classes is not None
            else DEFAULT_CLASSES
        ),
        teams=tuple(
            Team(t.name, t.department, _quotas(t.quotas), t.weight, t.may_burst) for t in doc.teams
        ),
        departments=tuple(Department(d.name, _quotas(d.quotas)) for d in doc.departments),
        default_team=Team("*", None, _quotas(default.quotas), default.weight, default.may_burst),
        aging=Aging(doc.aging.interval_s, doc.aging.step),
    )
    problems = check_policy(policy)
    if problems:
        raise PolicyError("; ".join(problems))
    return policy


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The dict form of `policy`: JSON- and YAML-safe, and read back by `policy_from_dict`."""
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
                "quotas": _quotas_dict(t.quotas),
            }
            for t in policy.teams
        ],
        "default_team": {
            "weight": policy.default_team.weight,
            "may_burst": policy.default_team.may_burst,
            "quotas": _quotas_dict(policy.default_team.quotas),
        },
        "aging": {"interval_s": policy.aging.interval_s, "step": policy.aging.step},
    }


def dump_policy(policy: Policy, fmt: str = "yaml") -> str:
    """The policy as YAML or JSON text."""
    data = policy_to_dict(policy)
    if fmt == "json":
        return json.dumps(data, indent=2)
    return str(yaml.safe_dump(data, sort_keys=False))


class _Doc(BaseModel):
    # No inf/NaN anywhere: every number below is bounded so no arithmetic on it overflows.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
    may_burst: bool = True
    quotas: dict[ModelKey, _QuotaDoc] = Field(default_factory=dict)


class _TeamDoc(_Doc):
    name: str = Field(pattern=DNS_LABEL_PATTERN)
    department: str | None = None
    weight: float = Field(default=1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT)
    may_burst: bool = False
    quotas: dict[ModelKey, _QuotaDoc] = Field(default_factory=dict)


class _AgingDoc(_Doc):
    interval_s: float = Field(default=900.0, ge=MIN_AGING_INTERVAL_S, le=MAX_AGING_INTERVAL_S)
    step: int = Field(default=25, ge=0, le=MAX_PRIORITY)


class _PolicyDoc(_Doc):
    version: int = FORMAT_VERSION
    priority_classes: list[_ClassDoc] | None = Field(default=None, max_length=64)
    departments: list[_DepartmentDoc] = Field(default_factory=list, max_length=10_000)
    teams: list[_TeamDoc] = Field(default_factory=list, max_length=100_000)
    default_team: _DefaultTeamDoc = Field(default_factory=_DefaultTeamDoc)
    aging: _AgingDoc = Field(default_factory=_AgingDoc)


def _quotas(quotas: dict[str, _QuotaDoc]) -> dict[str, Quota]:
    return {model: Quota(q.guaranteed, q.limit) for model, q in quotas.items()}


def _quotas_dict(quotas: Mapping[str, Quota]) -> dict[str, dict[str, float | None]]:
    return {model: {"guaranteed": q.guaranteed, "limit": q.limit} for model, q in quotas.items()}


def _describe(exc: ValidationError, data: dict[str, Any]) -> str:
    """Pydantic's errors as 'teams[vision].quotas[H100].guaranteed: message', joined."""
    parts = []
    for error in exc.errors():
        loc = error["loc"]
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
        parts.append(f"{path or 'policy'}: {error['msg']}")
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
