"""ServiceSpec: what a user may create, and the errors that say what is wrong."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from schemas import RestartPolicy
from schemas.services import ServiceSpec


def _spec(**over: Any) -> dict[str, Any]:
    return {"name": "llm", "team": "serving", "replica": {"command": ["serve"]}, **over}


def test_defaults_are_a_production_service_of_one_replica() -> None:
    spec = ServiceSpec.model_validate(_spec())
    assert (spec.priority_class, spec.min_replicas, spec.max_replicas) == ("production", 1, 1)


def test_replicas_shorthand_pins_both_bounds() -> None:
    spec = ServiceSpec.model_validate(_spec(replicas=3))
    assert (spec.min_replicas, spec.max_replicas) == (3, 3)


@pytest.mark.parametrize(
    ("over", "words"),
    [
        ({"min_replicas": 3, "max_replicas": 2}, "min_replicas (3) is above max_replicas (2)"),
        ({"replicas": 2, "min_replicas": 1}, "not both"),
        ({"regions": ["eu", "eu"]}, "twice"),
        ({"replica": {"command": ["x"], "env": {"GPUFED_PORT": "1"}}}, "replica: env"),
        ({"replica": {"command": ["x"], "gpus": 2, "gpu_fraction": 0.5}}, "gpus=1"),
        ({"health": {"path": "no-slash"}}, "health.path"),
        ({"max_replicas": 65}, "max_replicas"),
        ({"autoscaling": {"target": 0}}, "target"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(over: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError) as info:
        ServiceSpec.model_validate(_spec(**over))
    assert words in str(info.value)


def test_a_replica_is_a_workload_of_the_service_team_and_class() -> None:
    spec = ServiceSpec.model_validate(
        _spec(regions=["eu", "us"], replica={"command": ["serve"], "gpu_fraction": 0.5})
    )
    replica = spec.replica_spec(7, "us")
    assert (replica.name, replica.team, replica.priority_class) == (
        "llm-r7",
        "serving",
        "production",
    )
    assert replica.gpu_fraction == 0.5
    assert replica.affinity.required_regions == ("eu", "us")
    assert replica.affinity.preferred_regions == ("us",)
    assert replica.restart_policy == RestartPolicy.NEVER


def test_a_long_service_name_still_gives_valid_replica_names() -> None:
    spec = ServiceSpec.model_validate(_spec(name="a" * 63))
    assert len(spec.replica_spec(9999, None).name) <= 63
