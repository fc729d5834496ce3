"""A GPU model typed in another case is the fleet's model, in the fleet's spelling: in a
workload's spec and in a policy's quotas."""

from __future__ import annotations

from typing import Any

import pytest

from hub.core.gpumodels import canonical, learn, quota_models, respelt_policy
from hub.core.policy import Department, Policy, Quota, quota_for
from hub.core.windows import apply_window
from hub.policyfile import PolicyError, policy_from_dict, restored_policy


def test_a_model_is_taken_in_the_spelling_the_fleet_reported_first() -> None:
    known: dict[str, str] = {}
    assert learn(known, ["H100", "A100-SXM4-80GB"]) == ["H100", "A100-SXM4-80GB"]
    assert learn(known, ["h100"]) == []  # another spoke's spelling: the first one stays
    assert canonical(("h100", "a100-sxm4-80gb"), known) == ("H100", "A100-SXM4-80GB")
    assert canonical(("B200", "h100"), known) == ("B200", "H100")  # unknown: as typed


def test_models_spelt_as_the_fleet_does_are_the_very_tuple() -> None:
    known: dict[str, str] = {}
    learn(known, ["H100"])
    asked = ("H100", "L4")
    assert canonical(asked, known) is asked


def _policy(data: dict[str, Any]) -> Policy:
    return policy_from_dict({"version": 1, **data})


def test_a_policys_quotas_are_keyed_by_the_fleets_spelling_of_their_models() -> None:
    policy = _policy(
        {
            "departments": [{"name": "research", "quotas": {"h100": {"guaranteed": 8}}}],
            "teams": [
                {"name": "vision", "department": "research", "quotas": {"h100": {"guaranteed": 8}}},
                {"name": "nlp", "quotas": {"b200": {"limit": 2}, "*": {"limit": 1}}},
            ],
            "default_team": {"quotas": {"h100": {"limit": 1}}},
            "windows": [
                {
                    "name": "night",
                    "teams": {"vision": {"quotas": {"h100": {"guaranteed": 4}}}},
                    "departments": {"research": {"quotas": {"h100": {"guaranteed": 4}}}},
                    "default_team": {"quotas": {"h100": {"limit": 2}}},
                }
            ],
        }
    )
    known: dict[str, str] = {}
    learn(known, ["H100"])
    respelt = respelt_policy(policy, known)
    assert [m for m, _ in quota_models(respelt)] == ["H100", "H100", "b200", "*", "H100"] + [
        "H100"
    ] * 3  # B200, which no spoke has, stays as written
    assert quota_for(respelt.team("vision").quotas, "H100") == Quota(8.0)
    assert quota_for(respelt.team("someone").quotas, "H100") == Quota(0.0, 1.0)
    night = apply_window(respelt, respelt.windows[0])
    assert night.team("vision").quotas == {"H100": Quota(4.0)}
    assert night.department("research") == Department("research", {"H100": Quota(4.0)})
    assert respelt_policy(respelt, known) is respelt  # nothing left to respell: the very one


def test_a_policy_spells_each_model_one_way_the_first_it_is_written() -> None:
    # The window's `h100` changes vision's H100 quota: no second quota beside it.
    policy = _policy(
        {
            "teams": [{"name": "vision", "quotas": {"H100": {"guaranteed": 8}}}],
            "windows": [{"name": "night", "teams": {"vision": {"quotas": {"h100": {}}}}}],
        }
    )
    night = apply_window(policy, policy.windows[0])
    assert night.team("vision").quotas == {"H100": Quota(0.0)}


def test_two_quotas_of_one_model_in_one_mapping_are_refused() -> None:
    with pytest.raises(PolicyError) as refused:
        _policy({"teams": [{"name": "vision", "quotas": {"H100": {}, "h100": {"limit": 1}}}]})
    assert str(refused.value) == (
        "quotas of team vision: H100 and h100 are one GPU model (names are matched whatever "
        "their case); give it one quota"
    )


def test_a_stored_policy_naming_one_model_twice_keeps_the_quota_in_force_before() -> None:
    # An older hub stored it: quotas keyed as written, workloads' models in the fleet's
    # spelling, so vision's `H100` quota held and its `h100` one held nothing.
    stored = {
        "version": 1,
        "teams": [{"name": "vision", "quotas": {"h100": {"limit": 5}, "H100": {"limit": 1}}}],
        "windows": [
            {"name": "night", "teams": {"vision": {"quotas": {"a100": {}, "A100": {"limit": 2}}}}}
        ],
    }
    policy, dropped = restored_policy(stored, {"h100": "H100"})
    assert policy.team("vision").quotas == {"H100": Quota(0.0, 1.0)}
    # No spoke has reported A100: the first one written stays.
    assert apply_window(policy, policy.windows[0]).team("vision").quotas == {
        "H100": Quota(0.0, 1.0),
        "a100": Quota(0.0),
    }
    assert dropped == [
        "quotas of team vision: H100 kept, h100 dropped (one GPU model, names matched "
        "whatever their case)",
        "quotas of team vision in window night: a100 kept, A100 dropped (one GPU model, "
        "names matched whatever their case)",
    ]


def test_a_stored_policy_with_one_quota_for_each_model_is_restored_as_it_is() -> None:
    stored = {"version": 1, "teams": [{"name": "vision", "quotas": {"H100": {"limit": 1}}}]}
    policy, dropped = restored_policy(stored, {"h100": "H100"})
    assert dropped == []
    assert policy == policy_from_dict(stored)
