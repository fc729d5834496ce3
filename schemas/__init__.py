"""gpufed wire models (v1) and NATS subject names.

Imports nothing else of ours: every other package depends on this one.
"""

from schemas.capacity import CapacityReport, NodeCapacity, RunningRef, SpokeKind
from schemas.commands import (
    Assignment,
    CancelCommand,
    Command,
    PlaceCommand,
    PreemptCommand,
    parse_command,
)
from schemas.common import SCHEMA_VERSION, WireModel
from schemas.events import EventPhase, WorkloadEvent
from schemas.sync import SyncReply, SyncRequest
from schemas.workloads import (
    ErrorReply,
    Phase,
    RestartPolicy,
    SubmitReply,
    WorkloadSpec,
)

__all__ = [
    "SCHEMA_VERSION",
    "Assignment",
    "CancelCommand",
    "CapacityReport",
    "Command",
    "ErrorReply",
    "EventPhase",
    "NodeCapacity",
    "Phase",
    "PlaceCommand",
    "PreemptCommand",
    "RestartPolicy",
    "RunningRef",
    "SpokeKind",
    "SubmitReply",
    "SyncReply",
    "SyncRequest",
    "WireModel",
    "WorkloadEvent",
    "WorkloadSpec",
    "parse_command",
]
