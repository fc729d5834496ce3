"""NATS subjects, streams and consumer names (all under `gpufed.v1`)."""

from __future__ import annotations

PREFIX = "gpufed.v1"

SUBMIT = f"{PREFIX}.submit"
#: A NATS header of a `submit` request (as the REST API's HTTP header): sent again under the same
#: key, the request gets the workload the first made, never a second one.
IDEMPOTENCY_KEY = "Idempotency-Key"
#: A JSON list of WorkloadSpec in (at most MAX_BATCH, and within the server's max_payload),
#: a SubmitBatchReply out.
SUBMIT_BATCH = f"{PREFIX}.submit_batch"

COMMANDS_STREAM = "GPUFED_COMMANDS"
EVENTS_STREAM = "GPUFED_EVENTS"
COMMANDS_SUBJECTS = f"{PREFIX}.spoke.*.commands"
EVENTS_SUBJECTS = f"{PREFIX}.spoke.*.events"
CAPACITY_SUBJECTS = f"{PREFIX}.spoke.*.capacity"
SYNC_SUBJECTS = f"{PREFIX}.spoke.*.sync"
HUB_EVENTS_CONSUMER = "hub-events"


def capacity(spoke_id: str) -> str:
    return f"{PREFIX}.spoke.{spoke_id}.capacity"


def commands(spoke_id: str) -> str:
    return f"{PREFIX}.spoke.{spoke_id}.commands"


def events(spoke_id: str) -> str:
    return f"{PREFIX}.spoke.{spoke_id}.events"


def sync(spoke_id: str) -> str:
    return f"{PREFIX}.spoke.{spoke_id}.sync"


def logs(spoke_id: str) -> str:
    """Where the spoke answers log requests (schemas.logs: LogRequest -> LogReply)."""
    return f"{PREFIX}.spoke.{spoke_id}.logs"


def spoke_consumer(spoke_id: str) -> str:
    """Durable consumer name of a spoke's command stream."""
    return f"spoke-{spoke_id}"


def spoke_from_subject(subject: str) -> str | None:
    """The spoke id in `gpufed.v1.spoke.<id>.<kind>`, or None for another subject."""
    parts = subject.split(".")
    if len(parts) == 5 and parts[:3] == ["gpufed", "v1", "spoke"]:
        return parts[3]
    return None
