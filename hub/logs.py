"""A workload's log, fetched from the spoke it ran on (the spoke keeps the files)."""

from __future__ import annotations

import nats.errors
from pydantic import ValidationError

from bus.client import Bus
from hub.errors import Conflict, Unavailable
from hub.records import WorkloadRecord
from schemas import subjects
from schemas.logs import LogReply, LogRequest

#: How long a spoke has to answer.
LOG_TIMEOUT_S = 5.0


async def fetch_log(
    bus: Bus, record: WorkloadRecord, offset: int | None, max_bytes: int
) -> LogReply:
    """Ask the workload's spoke for a chunk of its log.

    Raises Conflict when it never ran anywhere, Unavailable when its spoke does not answer.
    A spoke that answers without the log (files gone, a runtime that keeps none) gives a reply
    with `ok` false and its reason.
    """
    spoke_id = record.spoke_id
    epoch: int | None = record.epoch if spoke_id is not None else None
    if spoke_id is None:
        spoke_id = _last_spoke(record)
    if spoke_id is None:
        raise Conflict(f"workload {record.id} has not run on any spoke yet: no log")
    request = LogRequest(workload_id=record.id, epoch=epoch, offset=offset, max_bytes=max_bytes)
    try:
        msg = await bus.nc.request(
            subjects.logs(spoke_id), request.model_dump_json().encode(), timeout=LOG_TIMEOUT_S
        )
        return LogReply.model_validate_json(msg.data)
    except nats.errors.NoRespondersError as exc:  # nobody listens for that spoke now
        raise Unavailable(
            f"spoke {spoke_id}, which ran {record.id}, is not connected now (stopped, lost, or "
            "a cloud spoke already given back, whose files went with its instance): its log "
            "cannot be read"
        ) from exc
    except (nats.errors.Error, TimeoutError) as exc:
        raise Unavailable(
            f"spoke {spoke_id} did not answer for the log of {record.id}: "
            f"{str(exc) or type(exc).__name__}"
        ) from exc
    except ValidationError as exc:
        raise Unavailable(f"spoke {spoke_id} sent an unreadable log reply: {exc}") from exc


def _last_spoke(record: WorkloadRecord) -> str | None:
    for entry in reversed(record.history):
        if entry.spoke_id:
            return entry.spoke_id
    return None
