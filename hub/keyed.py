"""Submissions under an `Idempotency-Key` (an HTTP header of `POST /v1/workloads`, a NATS
header of `submit`): one sent again is answered with what the first made.

A client that sent a submission and got no answer (the connection broke, the hub restarted or
failed over, a timeout) cannot tell whether it was taken. Sent again under the same key, it is
taken at most once: the key, with the caller and the team, names the workload's id
(`hub.ids.keyed_workload_id`), so the hub finds what the first made, in memory or in the
store, even after a restart or a failover, for as long as the workload is kept
(`keep_ended_s`). The same key with another spec is refused (`idempotency_key_reused`); one
sent while the first is still being taken waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from hub.authstore import AuditEntry
from hub.core import gpumodels
from hub.errors import InvalidRequest, KeyReused
from hub.ids import keyed_workload_id
from hub.records import WorkloadRecord
from schemas import WorkloadSpec

#: The longest key taken (the IETF draft's keys are UUIDs; room for a client's own scheme).
KEY_MAX = 128

#: The audit entry saved with a new workload, from its record (None: none).
Audit = Callable[[WorkloadRecord], AuditEntry] | None
#: Makes the record of `spec` for `user` under the given workload id, saved (with its audit
#: entry) when it returns.
Create = Callable[[WorkloadSpec, str, str, Audit], Awaitable[WorkloadRecord]]
#: The workload of that id, live or ended, or None.
Find = Callable[[str], Awaitable[WorkloadRecord | None]]


def check_key(key: str) -> str:
    """`key` if it is one: 1 to KEY_MAX printable ASCII characters; raises InvalidRequest."""
    if not 0 < len(key) <= KEY_MAX or not all(" " < c <= "~" for c in key):
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {KEY_MAX} printable ASCII characters, no spaces",
            field="Idempotency-Key",
        )
    return key


class KeyedSubmits:
    """Takes keyed submissions at most once each (for one hub process; the store for the rest)."""

    def __init__(self, create: Create, find: Find, gpu_models: Callable[[], Mapping[str, str]]):
        self._create = create
        self._find = find
        self._gpu_models = gpu_models
        self._taking: dict[str, asyncio.Event] = {}  # workload id -> set once its first ended

    async def submit(
        self, spec: WorkloadSpec, user: str, key: str, audit: Audit = None
    ) -> tuple[WorkloadRecord, bool]:
        """The workload `key` names for `user` and `spec.team`, and whether it was made before
        (True: nothing new was taken, nor audited). Raises what `create` raises, and
        KeyReused."""
        workload_id = keyed_workload_id(spec.team, user, check_key(key))
        while True:
            taking = self._taking.get(workload_id)
            if taking is not None:  # the same request, still being taken: its outcome is ours
                await taking.wait()
                continue
            earlier = await self._find(workload_id)
            if workload_id not in self._taking:  # (none began to take it while this one looked)
                break
        if earlier is not None:
            if earlier.spec != gpumodels.respelt(spec, self._gpu_models()):
                raise KeyReused(
                    f"Idempotency-Key {key!r} was sent before with another spec (workload"
                    f" {earlier.id}): a new submission needs a new key",
                    field="Idempotency-Key",
                )
            return earlier, True
        taking = self._taking[workload_id] = asyncio.Event()
        try:
            return await self._create(spec, user, workload_id, audit), False
        finally:
            del self._taking[workload_id]
            taking.set()
