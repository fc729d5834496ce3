"""GPU model names as people type them: taken in the fleet's spelling, whatever the case.

Spokes report their GPUs' models (`H100`, `A100-SXM4-80GB`), and placement matches a
workload's `gpu_models` to them exactly. A data scientist who types `--gpu-model h100` means
`H100`; taken as typed, the workload would wait for ever behind "no schedulable node has h100
GPUs" while H100s idle, and burst (which matches models whatever their case) could rent an
H100 it cannot use. So the hub takes a submitted model the fleet spells otherwise only in case
in the fleet's spelling; one no spoke has reported is kept as typed until one does (a cloud
spoke burst rented for it, a spoke that joins later), when the queued work that asked for it
is spelt as the fleet spells it.

Policy quotas are keyed by model the same way: one policy spells each model one way (the first
way it names it), and the hub keys them as the fleet spells them, so `h100: {guaranteed: 16}`
is an H100 guarantee.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

from hub.core.policy import Policy, Quota, Team, TeamChange
from schemas import WorkloadSpec


def learn(known: dict[str, str], models: Iterable[str]) -> list[str]:
    """Note the models a spoke reports in `known` (case-folded name -> the spelling first
    reported); a spelling once learnt stays, so one workload's model never moves between two.
    Returns the models new to `known`."""
    new = []
    for model in models:
        key = model.casefold()
        if key not in known:
            known[key] = model
            new.append(model)
    return new


def canonical(models: tuple[str, ...], known: Mapping[str, str]) -> tuple[str, ...]:
    """`models`, each in the fleet's spelling where the fleet knows it under another case; the
    very tuple when none changes."""
    spelt = tuple(known.get(model.casefold(), model) for model in models)
    return models if spelt == models else spelt


def respelt(spec: WorkloadSpec, known: Mapping[str, str]) -> WorkloadSpec:
    """`spec` asking for its models in the fleet's spelling (`canonical`); the very spec when
    nothing changes."""
    if not spec.gpu_models:
        return spec
    models = canonical(spec.gpu_models, known)
    return spec if models is spec.gpu_models else spec.model_copy(update={"gpu_models": models})


def respelt_policy(policy: Policy, known: Mapping[str, str]) -> Policy:
    """`policy` with every quota keyed by its model in `known`'s spelling (teams, departments,
    the default team and every window's changes); the very policy when none changes.

    Two keys of one mapping that are one model (`clashes`: `policy_from_dict` refuses such a
    policy) keep the last one's quota.
    """
    if all(known.get(model.casefold(), model) == model for model, _ in quota_models(policy)):
        return policy
    return _each_mapping(policy, lambda quotas: _quotas(quotas, known))


def settle(policy: Policy, known: Mapping[str, str]) -> tuple[Policy, list[str]]:
    """`policy` with one quota for each model in each mapping, and a note of every quota
    dropped: of two keys that are one model (`clashes`), the one in the fleet's spelling
    (`known`) stays, else the first.

    For a policy an older hub stored: it keyed quotas as written and took workloads' models in
    the fleet's spelling, so the quota in that spelling was the one in force, the other none.
    """
    named: dict[tuple[str, str], list[str]] = {}
    for model, owner in quota_models(policy):
        named.setdefault((owner, model.casefold()), []).append(model)
    notes = []
    for (owner, _), models in named.items():
        if len(models) > 1:
            kept = _kept(models, known)
            dropped = ", ".join(m for m in models if m != kept)
            notes.append(
                f"quotas of {owner}: {kept} kept, {dropped} dropped (one GPU model, names "
                "matched whatever their case)"
            )
    if not notes:
        return policy, []
    return _each_mapping(policy, lambda quotas: _one_each(quotas, known)), notes


def _kept(models: list[str], known: Mapping[str, str]) -> str:
    """Which of `models` (one model, spelt several ways) keeps its quota: `settle`."""
    spelt = known.get(models[0].casefold())
    return spelt if spelt in models else models[0]


def _one_each(quotas: Mapping[str, Quota], known: Mapping[str, str]) -> Mapping[str, Quota]:
    named: dict[str, list[str]] = {}
    for model in quotas:
        named.setdefault(model.casefold(), []).append(model)
    if all(len(models) == 1 for models in named.values()):
        return quotas
    kept = {_kept(models, known) for models in named.values()}
    return {model: quota for model, quota in quotas.items() if model in kept}


def _each_mapping(
    policy: Policy, change: Callable[[Mapping[str, Quota]], Mapping[str, Quota]]
) -> Policy:
    """`policy` with `change` made to every mapping of quotas (teams, departments, the default
    team and every window's); a team whose quotas `change` leaves is the very team."""

    def team(t: Team) -> Team:
        quotas = change(t.quotas)
        return t if quotas is t.quotas else replace(t, quotas=quotas)

    def team_change(c: TeamChange) -> TeamChange:
        quotas = change(c.quotas)
        return c if quotas is c.quotas else replace(c, quotas=quotas)

    windows = tuple(
        replace(
            w,
            teams={name: team_change(c) for name, c in w.teams.items()},
            departments={name: change(q) for name, q in w.departments.items()},
            default_team=None if w.default_team is None else team_change(w.default_team),
        )
        for w in policy.windows
    )
    return replace(
        policy,
        teams=tuple(team(t) for t in policy.teams),
        departments=tuple(replace(d, quotas=change(d.quotas)) for d in policy.departments),
        default_team=team(policy.default_team),
        windows=windows,
    )


def one_spelling(policy: Policy) -> Policy:
    """`policy` with each model its quotas name spelt one way: the first way `quota_models`
    lists it (a window's `h100` changes the team's `H100` quota, not a quota of its own)."""
    known: dict[str, str] = {}
    learn(known, (model for model, _ in quota_models(policy)))
    return respelt_policy(policy, known)


def clashes(policy: Policy) -> list[str]:
    """A problem for every quota keyed by a model its mapping already has in another case
    (`h100` beside `H100`): one model, two quotas, and which would count is not said."""
    seen: dict[tuple[str, str], str] = {}
    problems = []
    for model, owner in quota_models(policy):
        first = seen.setdefault((owner, model.casefold()), model)
        if first != model:
            problems.append(
                f"quotas of {owner}: {first} and {model} are one GPU model (names are matched "
                "whatever their case); give it one quota"
            )
    return problems


def quota_models(policy: Policy) -> Iterator[tuple[str, str]]:
    """(model, who it is a quota of) for every quota the policy and its windows set."""
    for department in policy.departments:
        yield from ((m, f"department {department.name}") for m in department.quotas)
    for team in policy.teams:
        yield from ((m, f"team {team.name}") for m in team.quotas)
    yield from ((m, "the default team") for m in policy.default_team.quotas)
    for window in policy.windows:
        where = f" in window {window.name}"
        for name, quotas in window.departments.items():
            yield from ((m, f"department {name}{where}") for m in quotas)
        for name, change in window.teams.items():
            yield from ((m, f"team {name}{where}") for m in change.quotas)
        if window.default_team is not None:
            yield from ((m, f"the default team{where}") for m in window.default_team.quotas)


def _quotas(quotas: Mapping[str, Quota], known: Mapping[str, str]) -> Mapping[str, Quota]:
    if all(known.get(model.casefold(), model) == model for model in quotas):
        return quotas
    return {known.get(model.casefold(), model): quota for model, quota in quotas.items()}
