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
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

from hub.authstore import AuditEntry
from hub.core import gpumodels
from hub.errors import HubError, InvalidRequest, KeyReused
from hub.ids import keyed_workload_id
from hub.records import WorkloadRecord
from schemas import WorkloadSpec

#: Stands in for a batch's spec not taken before, until it is taken.
_NOT_YET = HubError("not taken yet")

#: The longest key taken (the IETF draft's keys are UUIDs; room for a client's own scheme).
KEY_MAX = 128

#: The audit entry saved with a new workload, from its record (None: none).
Audit = Callable[[WorkloadRecord], AuditEntry] | None
#: Makes the record of `spec` for `user` under the given workload id, saved (with its audit
#: entry) when it returns.
Create = Callable[[WorkloadSpec, str, str, Audit], Awaitable[WorkloadRecord]]
#: The workloads of those ids that there are, live or ended, by id.
FindMany = Callable[[Sequence[str]], Awaitable[Mapping[str, WorkloadRecord]]]
#: Takes new workloads of specs under the given ids: per spec, the record or why it was refused.
TakeMany = Callable[
    [Sequence[WorkloadSpec], Sequence[str]], Awaitable[Sequence[WorkloadRecord | HubError]]
]


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

    def __init__(
        self, create: Create, find: FindMany, gpu_models: Callable[[], Mapping[str, str]]
    ) -> None:
        self._create = create
        self._find = find
        self._gpu_models = gpu_models
        self._taking: dict[str, asyncio.Event] = {}  # a key's name -> set once its taker ended

    async def submit(
        self, spec: WorkloadSpec, user: str, key: str, audit: Audit = None
    ) -> tuple[WorkloadRecord, bool]:
        """The workload `key` names for `user` and `spec.team`, and whether it was made before
        (True: nothing new was taken, nor audited). Raises what `create` raises, and
        KeyReused."""
        workload_id = keyed_workload_id(spec.team, user, check_key(key))
        async with self._alone(workload_id):
            earlier = (await self._find([workload_id])).get(workload_id)
            if earlier is None:
                return await self._create(spec, user, workload_id, audit), False
            reused = self._reused(earlier, spec, f"Idempotency-Key {key!r}")
            if reused is not None:
                raise reused
            return earlier, True

    async def submit_batch(
        self,
        specs: Sequence[WorkloadSpec],
        places: Sequence[int],
        user: str,
        key: str,
        take: TakeMany,
    ) -> list[WorkloadRecord | HubError]:
        """A batch under `key`: each spec named by the key and its place in the batch (`places`).
        Per spec, in order: the workload that names, made now by `take` (specs and their ids
        in; the new record or why it was refused out) or before, or KeyReused."""
        check_key(key)
        ids = [
            keyed_workload_id(spec.team, user, key, place)
            for spec, place in zip(specs, places, strict=True)
        ]
        async with self._alone(f"batch\n{user}\n{key}"):  # the batch as a whole
            found = await self._find(ids)
            results: list[WorkloadRecord | HubError] = []
            new = []  # (where in results, spec, id) of those not taken before
            for spec, place, workload_id in zip(specs, places, ids, strict=True):
                earlier = found.get(workload_id)
                if earlier is None:
                    new.append((len(results), spec, workload_id))
                    results.append(_NOT_YET)
                else:
                    reused = self._reused(earlier, spec, f"Idempotency-Key {key!r}, item {place},")
                    results.append(reused or earlier)
            if new:
                taken = await take([spec for _, spec, _ in new], [wid for _, _, wid in new])
                for (at, _, _), outcome in zip(new, taken, strict=True):
                    results[at] = outcome
        return results

    def _reused(self, earlier: WorkloadRecord, spec: WorkloadSpec, what: str) -> KeyReused | None:
        """Why `earlier` is not what `spec` under a key (`what`) asks for, or None: it was made
        of it."""
        if earlier.spec == gpumodels.respelt(spec, self._gpu_models()):
            return None
        return KeyReused(
            f"{what} was sent before with another spec (workload {earlier.id}): a new"
            " submission needs a new key",
            field="Idempotency-Key",
        )

    @contextlib.asynccontextmanager
    async def _alone(self, name: str) -> AsyncIterator[None]:
        """Held by one request for `name` at a time: one sent again while the first is being
        taken waits for its outcome, then finds what it made."""
        while (taking := self._taking.get(name)) is not None:
            await taking.wait()
        taking = self._taking[name] = asyncio.Event()
        try:
            yield
        finally:
            del self._taking[name]
            taking.set()
