"""Ids the hub mints. Decision ids are derived, so a re-sent decision dedupes on the bus."""

from __future__ import annotations

import secrets
import time


def new_workload_id() -> str:
    """Time-ordered, unique: `w` + milliseconds (hex) + 12 random hex digits.

    48 random bits: a batch mints thousands of ids in the same millisecond, and 24 bits made a
    collision (one workload silently overwriting another) likely once in a few batches.
    """
    return f"w{int(time.time() * 1000):x}{secrets.token_hex(6)}"


def decision_id(workload_id: str, epoch: int, kind: str) -> str:
    """The id of the one `kind` decision for a workload's assignment epoch."""
    return f"{workload_id}-e{epoch}-{kind}"
