"""A GPU model typed in another case is the fleet's model, in the fleet's spelling."""

from __future__ import annotations

from hub.core.gpumodels import canonical, learn


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
