"""Wire models: limits, messages that name the field, compatibility with older payloads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from gpufed.schema_export import export
from schemas import (
    CapacityReport,
    PlaceCommand,
    WorkloadEvent,
    WorkloadSpec,
    parse_command,
    subjects,
)

BASE = {"name": "train", "team": "vision", "command": ["python", "train.py"]}


def spec(**change: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate({**BASE, **change})


def test_defaults_make_a_one_gpu_batch_job() -> None:
    s = spec()
    assert (s.gpus_per_node, s.nodes, s.priority_class, s.gpu_models) == (1, 1, "batch", ())
    assert s.total_gpus == 1.0


def test_a_session_is_dev_unless_it_names_a_class() -> None:
    assert spec().kind == "job"
    assert spec(kind="session").priority_class == "dev"
    assert spec(kind="session", priority_class="training").priority_class == "training"
    assert spec(kind="service").priority_class == "batch"
    with pytest.raises(ValidationError, match="kind"):
        spec(kind="notebook")


def test_an_event_carries_an_endpoint_only_as_a_url() -> None:
    base = {
        "event_id": "e",
        "spoke_id": "s",
        "workload_id": "w",
        "epoch": 1,
        "phase": "running",
        "at": 0.0,
    }
    assert WorkloadEvent.model_validate(base).endpoint is None  # an older spoke's event
    url = "http://127.0.0.1:4242"
    assert WorkloadEvent.model_validate({**base, "endpoint": url}).endpoint == url
    with pytest.raises(ValidationError, match="endpoint"):
        WorkloadEvent.model_validate({**base, "endpoint": "javascript:alert(1)"})


def test_single_gpu_model_is_accepted_beside_the_list() -> None:
    assert spec(gpu_model="H100").gpu_models == ("H100",)
    assert spec(gpu_models=["H100", "A100"]).gpu_models == ("H100", "A100")
    with pytest.raises(ValidationError, match="not both"):
        spec(gpu_model="H100", gpu_models=["A100"])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": "UPPER"}, "name"),
        ({"name": "a" * 64}, "name"),
        ({"team": "-x"}, "team"),
        ({"gpus_per_node": 0}, "gpus_per_node"),
        ({"gpus_per_node": 17}, "gpus_per_node"),
        ({"nodes": 0}, "nodes"),
        ({"nodes": 129}, "nodes"),
        ({"command": []}, "command"),
        ({"command": [""]}, "command"),
        ({"command": ["a"] * 300}, "command"),
        ({"command": ["x" * 70_000]}, "command"),
        ({"env": {"A-B": "1"}}, "env"),
        ({"env": {"K": "v" * 70_000}}, "env"),
        ({"gpu_fraction": 0}, "gpu_fraction"),
        ({"gpu_fraction": 1}, "gpu_fraction"),
        ({"max_runtime_s": 0}, "max_runtime_s"),
        ({"gpu_models": ["bad model"]}, "gpu_models.0"),
        ({"affinity": {"required_labels": {"bad key!": "x"}}}, "affinity.required_labels"),
    ],
)
def test_invalid_specs_name_the_field(change: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(**change)
    locations = {".".join(str(p) for p in e["loc"]) for e in info.value.errors()}
    assert field in locations


def test_fraction_only_for_one_gpu_on_one_node() -> None:
    assert spec(gpu_fraction=0.25).total_gpus == 0.25
    with pytest.raises(ValidationError, match="gpu_fraction needs gpus_per_node=1 and nodes=1"):
        spec(gpu_fraction=0.5, gpus_per_node=2)
    with pytest.raises(ValidationError, match="gpu_fraction"):
        spec(gpu_fraction=0.5, nodes=2)


def test_gang_counts_all_its_gpus() -> None:
    assert spec(nodes=4, gpus_per_node=8).total_gpus == 32.0


def test_older_payload_without_later_fields_still_parses() -> None:
    # A v1 writer that predates `image`, `affinity` and `schema_version` in the payload.
    old = {"name": "a", "team": "t", "command": ["true"], "gpus_per_node": 2}
    assert WorkloadSpec.model_validate_json(json.dumps(old)).image is None
    newer = {**old, "a_field_from_the_future": 1}
    assert WorkloadSpec.model_validate(newer).gpus_per_node == 2


def test_commands_round_trip_through_the_discriminated_union() -> None:
    place = PlaceCommand(
        decision_id="w1-e1-place",
        workload_id="w1",
        epoch=1,
        spec=spec(),
        assignments=[{"node": "n0", "devices": [0]}],  # type: ignore[list-item]
    )
    parsed = parse_command(place.model_dump_json().encode())
    assert parsed == place
    cancel = parse_command(b'{"kind":"cancel","decision_id":"d","workload_id":"w","epoch":2}')
    assert cancel.kind == "cancel" and cancel.epoch == 2
    with pytest.raises(ValidationError):
        parse_command(b'{"kind":"explode","decision_id":"d","workload_id":"w","epoch":1}')
    with pytest.raises(ValidationError):
        parse_command(b'{"kind":"place","decision_id":"d","workload_id":"w","epoch":-1}')


def test_ids_are_safe_subject_tokens() -> None:
    with pytest.raises(ValidationError):
        WorkloadEvent(event_id="e", spoke_id="a.b", workload_id="w", epoch=1, phase="running", at=0)
    with pytest.raises(ValidationError):
        CapacityReport(spoke_id="eu-1", region="eu", incarnation="i", seq=0, sent_at=0,
                       nodes=[{"name": "n", "gpu_model": "H100", "gpu_count": 65}])  # fmt: skip


def test_subjects() -> None:
    assert subjects.commands("eu-1") == "gpufed.v1.spoke.eu-1.commands"
    assert subjects.spoke_from_subject("gpufed.v1.spoke.eu-1.events") == "eu-1"
    assert subjects.spoke_from_subject("gpufed.v1.submit") is None


def test_schema_export_writes_every_model(tmp_path: Path) -> None:
    paths = export(tmp_path)
    names = {p.name for p in paths}
    assert {"WorkloadSpec.schema.json", "Command.schema.json", "WorkloadEvent.schema.json"} <= names
    doc = json.loads((tmp_path / "WorkloadSpec.schema.json").read_text())
    assert doc["properties"]["gpus_per_node"]["maximum"] == 16
    assert "team" in doc["required"]
