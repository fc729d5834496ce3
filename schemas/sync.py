"""Full-state reconciliation between a spoke and the hub (request/reply on `…spoke.<id>.sync`)."""

from __future__ import annotations

from pydantic import Field

from schemas.capacity import MAX_RUNNING, RunningRef
from schemas.common import Identifier, ShortText, SpokeId, WireModel


class SyncRequest(WireModel):
    """Everything a spoke runs, and what it recently finished.

    `applied_seq` is the command stream sequence of the last command the spoke applied: a
    placement at or below it that the spoke neither runs nor finished was lost on the spoke.
    """

    spoke_id: SpokeId
    incarnation: ShortText
    running: tuple[RunningRef, ...] = Field(default=(), max_length=MAX_RUNNING)
    finished: tuple[RunningRef, ...] = Field(default=(), max_length=MAX_RUNNING)
    applied_seq: int = Field(default=0, ge=0)


class SyncReply(WireModel):
    """Corrections: stop these (their assignment was superseded or ended at the hub).

    Placements the spoke lost are requeued by the hub under a new epoch and arrive as new Place
    commands, so a reply never asks a spoke to start anything itself. Idempotent: the same
    request answered twice gives the same reply and changes nothing more.
    """

    stop: tuple[RunningRef, ...] = Field(default=(), max_length=MAX_RUNNING)
    requeued: tuple[Identifier, ...] = Field(default=(), max_length=MAX_RUNNING)
