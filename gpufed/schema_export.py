"""`gpufed schemas export DIR`: JSON Schema for every wire model."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, TypeAdapter

import schemas
from schemas.commands import Command
from schemas.logs import LogReply, LogRequest
from schemas.services import ServiceSpec
from schemas.workloads import Affinity

MODELS: dict[str, type[BaseModel]] = {
    "WorkloadSpec": schemas.WorkloadSpec,
    "Affinity": Affinity,
    "SubmitReply": schemas.SubmitReply,
    "ErrorReply": schemas.ErrorReply,
    "CapacityReport": schemas.CapacityReport,
    "NodeCapacity": schemas.NodeCapacity,
    "PlaceCommand": schemas.PlaceCommand,
    "CancelCommand": schemas.CancelCommand,
    "PreemptCommand": schemas.PreemptCommand,
    "WorkloadEvent": schemas.WorkloadEvent,
    "LogRequest": LogRequest,
    "LogReply": LogReply,
    "ServiceSpec": ServiceSpec,  # what `gpufed service create -f` and POST /v1/services take
}


def export(directory: Path) -> list[Path]:
    """Write one `<Model>.schema.json` per wire model (and `Command` for the union)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    documents = {name: model.model_json_schema() for name, model in MODELS.items()}
    documents["Command"] = TypeAdapter(Command).json_schema()
    for name, document in sorted(documents.items()):
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        written.append(path)
    return written
