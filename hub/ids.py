"""Ids the hub mints. Decision ids are derived, so a re-sent decision dedupes on the bus."""

from __future__ import annotations

import hashlib
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


def keyed_workload_id(team: str, user: str, key: str, place: int | None = None) -> str:
    """The id of the workload that `user` submits for `team` under an Idempotency-Key
    (`hub.keyed`), or at `place` in a batch under it: the same for the same, so a submission
    sent again finds the first.

    `w` + 23 hex digits, as long as a minted id (92 bits: two keys never meet by chance; a key
    holds no line break, so a batch's never meets a lone submission's).
    """
    named = f"{team}\n{user}\n{key}" if place is None else f"{team}\n{user}\n{key}\n{place}"
    digest = hashlib.sha256(named.encode()).hexdigest()
    return f"w{digest[:23]}"
