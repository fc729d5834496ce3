"""Serving a workload's log to the hub over NATS request/reply (`gpufed logs`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter

import nats.errors
from nats.aio.msg import Msg
from pydantic import ValidationError

from schemas import logs as log_schemas
from spoke.errors import SpokeError
from spoke.ports import LogSource, Runtime


async def answer_log_request(
    msg: Msg, runtime: Runtime, spoke_id: str, counters: Counter[str]
) -> None:
    """Answer a log request with at most its `max_bytes` of the workload's log."""
    try:
        request = log_schemas.LogRequest.model_validate_json(msg.data)
    except ValidationError as exc:
        counters["malformed"] += 1
        reply = log_schemas.LogReply(ok=False, error=f"bad log request: {str(exc)[:500]}")
    else:
        reply = await read_log(runtime, spoke_id, request)
    if msg.reply:
        with contextlib.suppress(nats.errors.Error):
            await msg.respond(reply.model_dump_json().encode())


async def read_log(
    runtime: Runtime, spoke_id: str, request: log_schemas.LogRequest
) -> log_schemas.LogReply:
    """A chunk of a workload's log, or a reply saying why there is none."""
    if not isinstance(runtime, LogSource):
        return log_schemas.LogReply(
            ok=False, error=f"spoke {spoke_id}'s runtime does not serve logs"
        )
    try:
        chunk = await asyncio.to_thread(
            runtime.read_log,
            request.workload_id,
            request.epoch,
            request.offset,
            request.max_bytes,
        )
    except (SpokeError, OSError) as exc:
        return log_schemas.LogReply(ok=False, error=str(exc)[:1000])
    return log_schemas.LogReply(
        ok=True,
        data=chunk.data.decode("utf-8", errors="replace"),
        offset=chunk.offset,
        next_offset=chunk.next_offset,
        size=chunk.size,
        epoch=chunk.epoch,
    )
