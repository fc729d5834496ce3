"""`gpufed policy set` warns of quotas for GPU models no spoke has (`A10O`, a typing slip, gives
a team no A100 limit at all), naming where each is used and what it likely meant; a model in
another case is the fleet's (`h100` is `H100`)."""

from __future__ import annotations

from gpufed.policy_check import overlapping_windows, unknown_models

POLICY = {
    "departments": [{"name": "research", "quotas": {"H100": {"guaranteed": 8}}}],
    "teams": [
        {"name": "vision", "quotas": {"h100": {"guaranteed": 16}, "*": {"limit": 4}}},
        {"name": "nlp", "quotas": {"B200": {"guaranteed": 8}, "A100": {}}},
    ],
    "default_team": {"quotas": {"A10O": {"limit": 2}}},
    "windows": [{"name": "night", "teams": {"nlp": {"quotas": {"a100": {"guaranteed": 4}}}}}],
}


def test_each_model_no_spoke_has_is_named_with_its_users_and_nearest_model() -> None:
    assert unknown_models(POLICY, {"H100", "L4"}) == [
        "no spoke has GPU model A100 now (quotas of team nlp, team nlp in window night); "
        "did you mean H100?",
        "no spoke has GPU model A10O now (quotas of the default team)",
        "no spoke has GPU model B200 now (quotas of team nlp)",
    ]


def test_a_model_in_another_case_than_the_fleets_is_no_unknown_model() -> None:
    # vision's `h100` and the night window's `a100` are the fleet's H100 and A100.
    assert unknown_models(POLICY, {"H100", "A100", "L4"}) == [
        "no spoke has GPU model A10O now (quotas of the default team); did you mean A100?",
        "no spoke has GPU model B200 now (quotas of team nlp)",
    ]
    assert unknown_models(POLICY, {"h100", "a100", "b200", "a10o"}) == []


def test_nothing_to_say_when_no_spoke_has_reported() -> None:
    assert unknown_models(POLICY, set()) == []


def test_windows_in_force_at_once_are_named_with_when_and_which_applies() -> None:
    workday = {"name": "workday", "timezone": "Europe/Berlin", "days": "weekdays"}
    document = {
        "teams": [{"name": "serving"}],
        "windows": [
            {**workday, "start": "08:00", "end": "20:00"},
            {"name": "evening", "timezone": "Europe/Berlin", "start": "18:00", "end": "23:00"},
            {
                "name": "friday",
                "timezone": "Europe/Berlin",
                "days": ["fri"],
                "start": "09:00",
                "end": "17:00",
            },
        ],
    }
    sunday_noon_berlin = 1796554800.0  # 2026-12-06 12:00 +01:00
    assert overlapping_windows(document, sunday_noon_berlin) == [
        "windows workday and evening are both in force at times (first at Mon 18:00 "
        "Europe/Berlin); workday, listed first, applies then",
        "window friday never applies: window workday, listed before it, is in force whenever it is",
    ]
    assert overlapping_windows({"teams": [], "windows": [document["windows"][0]]}, 0.0) == []
