"""The policy file: what loads, what is refused and why, and that it round-trips."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hub.core.policy import (
    DEFAULT_BURST_DOLLARS_PER_HOUR,
    DEFAULT_CLASSES,
    DEFAULT_MAX_QUEUED,
    Quota,
)
from hub.policyfile import PolicyError, dump_policy, load_policy, policy_from_dict, policy_to_dict

EXAMPLE = Path(__file__).parents[3] / "deploy" / "policy.example.yaml"


def test_the_example_policy_loads() -> None:
    policy = load_policy(EXAMPLE.read_text())
    vision = policy.team("vision")
    assert vision.department == "research"
    assert vision.quotas["H100"] == Quota(16, 48)
    assert vision.may_burst
    assert not policy.team("someone-else").may_burst
    assert policy.priority("production") == 1000


def test_empty_text_is_the_default_policy_that_keeps_unlisted_teams_off_the_cloud() -> None:
    policy = load_policy("")
    assert policy.classes == DEFAULT_CLASSES
    assert not policy.has_quotas
    assert not policy.team("made-up").may_burst
    assert policy.max_queued("made-up") == DEFAULT_MAX_QUEUED
    assert policy.burst.dollars_per_hour == DEFAULT_BURST_DOLLARS_PER_HOUR


def test_round_trip_through_dict_yaml_and_json() -> None:
    policy = load_policy(EXAMPLE.read_text())
    assert policy_from_dict(policy_to_dict(policy)) == policy
    assert load_policy(dump_policy(policy)) == policy
    assert load_policy(dump_policy(policy, "json")) == policy
    json.dumps(policy_to_dict(policy))  # plain data only


def test_ordering_loads_and_round_trips() -> None:
    policy = load_policy(
        "ordering: {mode: las, thresholds_gpu_s: [3250, 7200], min_run_s: 60, patience_s: 300}"
    )
    assert policy.ordering.mode == "las"
    assert policy.ordering.thresholds_gpu_s == (3250.0, 7200.0)
    assert policy.ordering.min_run_s == 60.0
    assert policy.ordering.patience_s == 300.0
    assert policy.ordering.exempt_gpus == 32  # default
    assert load_policy(dump_policy(policy)) == policy
    assert load_policy("").ordering.mode == "fifo"
    with pytest.raises(PolicyError, match=r"ordering\.mode"):
        load_policy("ordering: {mode: sjf}")
    with pytest.raises(PolicyError, match=r"ordering\.thresholds_gpu_s: positive GPU-seconds"):
        load_policy("ordering: {mode: las, thresholds_gpu_s: [7200, 3600]}")


def test_consolidation_is_off_unless_the_policy_turns_it_on() -> None:
    assert not load_policy("").consolidation.enabled
    policy = load_policy("consolidation: {enabled: true, after_s: 600, max_per_cycle: 2}")
    rule = policy.consolidation
    assert (rule.enabled, rule.after_s, rule.max_per_cycle) == (True, 600.0, 2)
    assert policy_from_dict(policy_to_dict(policy)) == policy
    with pytest.raises(PolicyError, match=r"consolidation\.after_s"):
        load_policy("consolidation: {after_s: -1}")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "teams: [{name: a, quotas: {H100: {guaranteed: -1}}}]",
            "teams[a].quotas[H100].guaranteed: Input should be greater than or equal to 0",
        ),
        (
            "teams: [{name: a, quotas: {H100: {guaranteed: 8, limit: 4}}}]",
            "teams[a].quotas[H100].limit: 4 is below the guaranteed 8",
        ),
        ("teams: [{name: a, department: x}]", "teams[a].department: unknown department 'x'"),
        ("teams: [{name: a}, {name: a}]", "teams[a]: defined more than once"),
        ("departments: [{name: d}, {name: d}]", "departments[d]: defined more than once"),
        (
            "priority_classes: [{name: production, value: 1000}]",
            "priority_classes[production].preemptible: production work is never preempted",
        ),
        (
            "priority_classes: [{name: gold, value: 9, preemptible: false}]",
            "priority_classes[gold].may_borrow: a class that is never preempted cannot borrow",
        ),
        ("priority_classes: []", "priority_classes: at least one class is needed"),
        ("teams: [{name: a, wieght: 2}]", "teams[a]: unknown field: wieght (did you mean weight?)"),
        ("teamz: []", "policy: unknown field: teamz (did you mean teams?)"),
        (
            "teams: [{name: a, weight: 0}]",
            "teams[a].weight: Input should be greater than or equal to 0.001",
        ),
        (
            "teams: [{name: Bad_Name}]",
            "teams[Bad_Name].name: must be lower-case letters, digits and '-', starting and "
            "ending with a letter or digit (not 'Bad_Name')",
        ),
        (
            "departments: [{name: d, quotas: {H100: {guaranteed: 8}}}]\n"
            "teams: [{name: a, department: d, quotas: {H100: {guaranteed: 12}}}]",
            "departments[d].quotas[H100].guaranteed: 8 is less than its teams' guarantees (12)",
        ),
        ("aging: {interval_s: 0}", "aging.interval_s: Input should be greater than or equal to 1"),
        ("version: 2", "version: this hub reads policy version 1"),
        ("[1, 2]", "policy: expected a mapping at the top level"),
        ("teams: [", "policy is not valid YAML"),
    ],
)
def test_invalid_policy_names_the_field(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(text)
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_limit_may_be_left_out_for_no_cap() -> None:
    policy = load_policy("teams: [{name: a, quotas: {'*': {guaranteed: 2}}}]")
    assert policy.team("a").quotas["*"] == Quota(2, None)


def test_dump_is_readable_yaml() -> None:
    data = yaml.safe_load(dump_policy(load_policy(EXAMPLE.read_text())))
    assert data["teams"][0]["name"] == "vision"
    assert data["version"] == 1


def test_sessions_and_idle_read_durations_and_round_trip() -> None:
    from hub.policyfile import load_policy, policy_from_dict, policy_to_dict

    policy = load_policy(
        "sessions: {idle_after: 30m, max_lifetime: 1h30m}\n"
        "idle: {util_percent: 3, flag_after: 90, reclaim_after: 2h, classes: [dev, batch]}\n"
    )
    assert (policy.sessions.idle_after_s, policy.sessions.max_lifetime_s) == (1800.0, 5400.0)
    assert policy.idle.util_percent == 3
    assert (policy.idle.flag_after_s, policy.idle.reclaim_after_s) == (90.0, 7200.0)
    assert policy.idle.reclaim_classes == ("dev", "batch")
    assert policy_from_dict(policy_to_dict(policy)) == policy
    default = load_policy("teams: []")
    assert default.sessions.idle_after_s is None and default.idle.reclaim_after_s is None


def test_a_bad_duration_names_the_field() -> None:
    import pytest

    from hub.policyfile import PolicyError, load_policy

    with pytest.raises(PolicyError, match=r"sessions.idle_after.*30 minutes"):
        load_policy("sessions: {idle_after: 30 minutes}")
    with pytest.raises(PolicyError, match=r"idle.reclaim_after"):
        load_policy("idle: {reclaim_after: -5}")
