"""Hostile input is refused at validation, naming the field, before it reaches anything else."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from hub.policyfile import PolicyError, load_policy
from schemas import CapacityReport, WorkloadEvent, WorkloadSpec
from schemas.commands import CancelCommand
from schemas.common import SPOKE_ID_MAX, clean_text
from schemas.events import EventPhase
from schemas.sync import SyncRequest
from spoke.settings import SpokeSettings

pytestmark = pytest.mark.security

SPEC: dict[str, Any] = {"name": "job", "team": "vision", "command": ["python", "train.py"]}


def refused(model: Any, **fields: Any) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(fields)
    return caught.value


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"command": ["python", "train.py\x00--evil"]}, "command"),
        ({"command": ["\x1b[2Jpython"]}, "command"),
        ({"env": {"DATA": "a\x00b"}}, "env"),
        ({"env": {"DATA": "bell\x07"}}, "env"),
        ({"working_dir": "/data\x00"}, "working_dir"),
        ({"image": "repo/img\x7f:1"}, "image"),
        ({"name": "job\x00"}, "name"),
        ({"team": "vision\n"}, "team"),
    ],
)
def test_nul_and_control_characters_are_refused_naming_the_field(
    change: dict[str, Any], field: str
) -> None:
    error = refused(WorkloadSpec, **{**SPEC, **change})
    assert [e["loc"][0] for e in error.errors()] == [field]


def test_tabs_and_newlines_in_a_script_are_fine() -> None:
    spec = WorkloadSpec.model_validate({**SPEC, "command": ["sh", "-c", "set -e\n\techo hi\r\n"]})
    assert spec.command[2].startswith("set -e")


@pytest.mark.parametrize("name", ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "GPUFED_NODE"])
def test_a_workload_cannot_choose_its_own_gpus(name: str) -> None:
    error = refused(WorkloadSpec, **{**SPEC, "env": {name: "all"}})
    [problem] = error.errors()
    assert problem["loc"] == ("env",)
    assert name in problem["msg"]


def test_spoke_ids_are_bounded_so_derived_ids_fit() -> None:
    longest = "s" * SPOKE_ID_MAX
    assert SpokeSettings(id=longest, region="eu").id == longest
    with pytest.raises(ValidationError):
        SpokeSettings(id=longest + "x", region="eu")
    refused(CapacityReport, spoke_id=longest + "x", region="eu", incarnation="i", seq=0, sent_at=0)
    # The spoke's event id (`<spoke>-<workload>-e<epoch>-<phase>`) with the longest parts.
    workload = "w" * 63
    event = WorkloadEvent(
        event_id=f"{longest}-{workload}-e{2**31 - 1}-{EventPhase.SUCCEEDED.value}",
        spoke_id=longest,
        workload_id=workload,
        epoch=2**31 - 1,
        phase=EventPhase.SUCCEEDED,
        at=0.0,
    )
    assert event.spoke_id == longest


@pytest.mark.parametrize(
    ("model", "fields", "field"),
    [
        (
            WorkloadEvent,
            {"event_id": "e", "spoke_id": "eu-1", "workload_id": "w1", "epoch": 1,
             "phase": "failed", "at": 0, "reason": "x" * 1_000_000},
            "reason",
        ),
        (
            WorkloadEvent,
            {"event_id": "e", "spoke_id": "eu-1", "workload_id": "w1", "epoch": 1,
             "phase": "failed", "at": 0, "message": "m" * 5000},
            "message",
        ),
        (
            CapacityReport,
            {"spoke_id": "eu-1", "region": "eu", "incarnation": "i" * 300, "seq": 0,
             "sent_at": 0},
            "incarnation",
        ),
        (
            CapacityReport,
            {"spoke_id": "eu-1", "region": "eu", "incarnation": "i", "seq": 0, "sent_at": 0,
             "labels": {f"k{i}": "v" for i in range(65)}},
            "labels",
        ),
        (
            CapacityReport,
            {"spoke_id": "eu-1", "region": "eu", "incarnation": "i", "seq": 0, "sent_at": 0,
             "labels": {"burst-team": "v" * 64}},
            "labels",
        ),
        (SyncRequest, {"spoke_id": "eu-1", "incarnation": "i\x00"}, "incarnation"),
        (
            CancelCommand,
            {"decision_id": "d", "workload_id": "w", "epoch": 1, "reason": "r" * 300},
            "reason",
        ),
    ],
)  # fmt: skip
def test_every_text_field_on_the_wire_is_bounded(
    model: Any, fields: dict[str, Any], field: str
) -> None:
    error = refused(model, **fields)
    assert {e["loc"][0] for e in error.errors()} == {field}


@pytest.mark.parametrize(
    ("yaml_text", "field"),
    [
        ("aging: {interval_s: 5e-324}", "aging.interval_s"),
        ("aging: {interval_s: 0.5}", "aging.interval_s"),
        ("aging: {interval_s: .inf}", "aging.interval_s"),
        ("aging: {step: 100000000000}", "aging.step"),
        ("teams: [{name: a, weight: 1.0e-320}]", "weight"),
        ("teams: [{name: a, weight: .nan}]", "weight"),
        ("teams: [{name: a, quotas: {H100: {guaranteed: .inf}}}]", "guaranteed"),
        ("priority_classes: [{name: x, value: 100000000000000000000}]", "value"),
    ],
)
def test_policy_numbers_are_bounded(yaml_text: str, field: str) -> None:
    with pytest.raises(PolicyError, match=field.replace(".", r"\.")):
        load_policy(yaml_text)


def test_an_aging_interval_of_one_second_is_accepted() -> None:
    assert load_policy("aging: {interval_s: 1}").aging.interval_s == 1.0


def test_runtime_text_is_made_to_fit_rather_than_refused() -> None:
    # What a spoke does with a pod's termination message before it goes on the wire.
    message = clean_text("\x1b[31mKilled\x00" + "x" * 10_000, 4096)
    event = WorkloadEvent(
        event_id="e", spoke_id="eu-1", workload_id="w1", epoch=1, phase=EventPhase.FAILED,
        at=0.0, reason=clean_text("r" * 1000, 256), message=message,
    )  # fmt: skip
    assert len(event.message) == 4096 and "\x00" not in event.message
    assert len(event.reason) == 256
