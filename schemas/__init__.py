"""gpufed wire models (v1) and NATS subject names.

Imports nothing else of ours: every other package depends on this one.
"""

from schemas.capacity import (
    CapacityReport,
    LeaseAck,
    NodeCapacity,
    RunningRef,
    RuntimeCapabilities,
    SpokeKind,
    mig_profile,
)
from schemas.commands import (
    Assignment,
    CancelCommand,
    Command,
    PlaceCommand,
    PreemptCommand,
    parse_command,
    parse_commands,
)
from schemas.common import SCHEMA_VERSION, WireModel
from schemas.errors import ErrorReply, GpufedError
from schemas.events import EventPhase, WorkloadEvent, parse_events
from schemas.sync import SyncReply, SyncRequest
from schemas.workloads import (
    MAX_BATCH,
    HubLoss,
    Phase,
    RestartPolicy,
    SubmitBatchReply,
    SubmitReply,
    WorkloadKind,
    WorkloadSpec,
)

__all__ = [
    "MAX_BATCH",
    "SCHEMA_VERSION",
    "Assignment",
    "CancelCommand",
    "CapacityReport",
    "Command",
    "ErrorReply",
    "EventPhase",
    "GpufedError",
    "HubLoss",
    "LeaseAck",
    "NodeCapacity",
    "Phase",
    "PlaceCommand",
    "PreemptCommand",
    "RestartPolicy",
    "RunningRef",
    "RuntimeCapabilities",
    "SpokeKind",
    "SubmitBatchReply",
    "SubmitReply",
    "SyncReply",
    "SyncRequest",
    "WireModel",
    "WorkloadEvent",
    "WorkloadKind",
    "WorkloadSpec",
    "mig_profile",
    "parse_command",
    "parse_commands",
    "parse_events",
]
