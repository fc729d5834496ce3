"""A workload's log, read from its spoke: hub -> spoke request/reply on `subjects.logs(id)`.

Bounded both ways: a request asks for at most MAX_LOG_BYTES, and a spoke answers with no more.
`offset` None means the tail: the last `max_bytes` of the file. Following a log is asking again
from the `next_offset` of the previous reply.
"""

from __future__ import annotations

from pydantic import Field

from schemas.common import Identifier, WireModel

#: The most a single reply carries (JSON-escaped, still under NATS' default 1 MiB payload).
MAX_LOG_BYTES = 128 * 1024


class LogRequest(WireModel):
    workload_id: Identifier
    epoch: int | None = Field(default=None, ge=0, description="None: the latest it ran under.")
    offset: int | None = Field(default=None, ge=0, description="None: the tail.")
    max_bytes: int = Field(default=64 * 1024, ge=1, le=MAX_LOG_BYTES)


class LogReply(WireModel):
    """`data` is the file's bytes [offset, next_offset) decoded as UTF-8 (bad bytes replaced)."""

    ok: bool
    data: str = ""
    offset: int = Field(default=0, ge=0)
    next_offset: int = Field(default=0, ge=0)
    size: int = Field(default=0, ge=0, description="The file's size when it was read.")
    epoch: int | None = None
    error: str = Field(default="", max_length=1024)
