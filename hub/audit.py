"""The audit log: every mutating action, who did it, when, on what, and how it ended.

Appended by the API (submit, cancel, policy set, token create and revoke, refused or not) and
by the hub when burst reports a launch or a termination. Entries are never changed or deleted.

Refusals alike (one caller, one action, one team, one result) are listed one by one up to
`hub.core.refusals.LISTED` a minute; past that they are counted in one entry when the minute
ends, naming a few targets: any valid token can ask for refusals as fast as the hub answers,
and the log must not grow with them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypedDict, Unpack

import structlog

from hub.authstore import AuditEntry, AuthStore
from hub.core.access import Principal
from hub.core.refusals import Held, RefusalThrottle
from schemas import WorkloadSpec

log = structlog.get_logger(__name__)

#: Longest detail kept per entry (a refusal message, a policy summary).
MAX_DETAIL = 500
#: Entries one `audit` log line lists; a batch of thousands is counted past them, not listed.
LISTED_MAX = 20


class EntryFields(TypedDict, total=False):
    """What an entry says beyond who and which action (`Auditor.entry`'s keywords)."""

    team: str | None
    target: str
    result: str
    detail: str
    actor: str | None


class Auditor:
    """Appends audit entries through the hub's store runner.

    Entries group-commit: those recorded while a write runs go together in the next
    transaction, so a burst of submissions costs a transaction per burst, not per entry.
    Refusals pass `refusals` first (None: every one is listed); `close` writes what it holds.
    """

    def __init__(
        self,
        store: AuthStore,
        db: Callable[..., Awaitable[Any]],
        clock: Callable[[], float],
        refusals: RefusalThrottle[AuditEntry] | None = None,
    ) -> None:
        self.store = store
        self._db = db
        self._clock = clock
        self._waiting: list[tuple[AuditEntry, asyncio.Future[bool]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._refusals = refusals
        self._summaries: asyncio.Task[None] | None = None

    async def record(
        self, principal: Principal | None, action: str, **fields: Unpack[EntryFields]
    ) -> None:
        """Append one entry (`entry`'s); a failure to write is logged, never raised."""
        await self.append(self.entry(principal, action, **fields))

    def entry(
        self,
        principal: Principal | None,
        action: str,
        *,
        team: str | None = None,
        target: str = "",
        result: str = "ok",
        detail: str = "",
        actor: str | None = None,
    ) -> AuditEntry:
        """The entry `record` appends, made now (to be saved with what it records)."""
        return AuditEntry(
            at=self._clock(),
            actor=actor or (principal.user if principal else "anonymous"),
            role=principal.role_on(team) if principal else "none",
            via=principal.via if principal else "",
            action=action,
            team=team,
            target=target[:200],
            result=result[:64],
            detail=detail[:MAX_DETAIL],
        )

    async def append(self, entry: AuditEntry) -> None:
        """Append an entry made here (`nats_entry`); as `record`, a failure is only logged."""
        await self.append_all([entry])

    async def append_all(self, entries: Sequence[AuditEntry]) -> None:
        """Append entries made here, written together; as `record`, a failure is only logged.
        Refusals alike past the throttle's first few are counted instead (see the module)."""
        refusals = self._refusals
        if refusals is not None and any(e.result != "ok" for e in entries):
            entries = [
                e
                for e in entries
                if e.result == "ok" or refusals.admit(_alike(e), e, e.target, e.at)
            ]
            if self._summaries is None or self._summaries.done():
                self._summaries = asyncio.create_task(self._summarise(), name="hub-audit-alike")
        await self._write(entries)

    async def close(self) -> None:
        """At a stop: the counts of refusals held so far are written now."""
        if self._refusals is None:
            return
        if self._summaries is not None:
            self._summaries.cancel()
        await self._write(self._summed(self._refusals.flush()))

    async def _summarise(self) -> None:
        """While refusals' windows are open: each one's summary once it ends."""
        assert self._refusals is not None
        while (due := self._refusals.next_due()) is not None:
            await asyncio.sleep(max(0.0, due - self._clock()))
            await self._write(self._summed(self._refusals.due(self._clock())))

    def _summed(self, held: Sequence[Held[AuditEntry]]) -> list[AuditEntry]:
        assert self._refusals is not None
        window_s = self._refusals.window_s
        return [
            h.first.model_copy(
                update={
                    "at": h.last_at,
                    "target": "",
                    "detail": h.describe(h.first.result, window_s)[:MAX_DETAIL],
                }
            )
            for h in held
        ]

    async def _write(self, entries: Sequence[AuditEntry]) -> None:
        loop = asyncio.get_running_loop()
        waits: list[asyncio.Future[bool]] = []
        for entry in entries:
            done: asyncio.Future[bool] = loop.create_future()
            self._waiting.append((entry, done))
            waits.append(done)
        if waits and (self._writer is None or self._writer.done()):
            # Its own task: a caller that goes away must not cancel the others' write.
            self._writer = asyncio.create_task(self._write_queued(), name="hub-audit")
        for done in waits:
            await done

    async def _write_queued(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting, []
            entries = [entry for entry, _ in batch]
            try:
                await self._db(self.store.append_audits, entries)
                written = True
            except Exception:
                log.exception("audit_write_failed", entries=len(batch))
                written = False
            for _, done in batch:
                if not done.done():
                    done.set_result(written)
            if written:
                log_written(entries)

    def nats_entry(self, spec: WorkloadSpec, workload_id: str | None, result: str) -> AuditEntry:
        """The entry of a submission that came over NATS (`gpufed.v1.submit`: no API
        identity). An accepted one is saved with the workload itself (`HubState.submit_audit`);
        a refused one goes through `append`."""
        return AuditEntry(
            at=self._clock(),
            actor="nats",
            role="none",
            via="nats",
            action="submit",
            team=spec.team,
            target=(workload_id or "")[:200],
            result=result[:64],
            detail=f"{spec.name} {spec.priority_class} {spec.total_gpus:g} GPU(s) over NATS"[
                :MAX_DETAIL
            ],
        )

    async def nats_submit(self, spec: WorkloadSpec, workload_id: str | None, result: str) -> None:
        """Audit a submission that came over NATS."""
        await self.append(self.nats_entry(spec, workload_id, result))


def _alike(e: AuditEntry) -> tuple[str, str, str, str, str | None, str]:
    """What makes refusals alike: who (and how authenticated), the action, team and result."""
    return (e.actor, e.via, e.role, e.action, e.team, e.result)


def log_written(entries: Sequence[AuditEntry], unlisted: int = 0) -> None:
    """One info line per write, never the spec's env: only who, what, which team and target.

    A write of one entry keeps the line's old fields; a group commit (a burst of submissions)
    lists its entries on one line: a line each was a tenth of the hub's CPU at 400/s.
    `unlisted`: entries written since the last line and left out of the log (saved
    submissions log at most a line a second, `bus.loglines`; the store keeps every entry);
    a write of more than LISTED_MAX entries (a batch submission) lists that many and counts
    the rest as unlisted.
    """
    if len(entries) == 1 and not unlisted:
        e = entries[0]
        log.info(
            "audit", actor=e.actor, action=e.action, team=e.team, target=e.target, result=e.result
        )
        return
    listed = entries[:LISTED_MAX]
    unlisted += len(entries) - len(listed)
    log.info(
        "audit",
        count=len(entries),
        entries=[
            f"{e.actor} {e.action} {e.team or '-'} {e.target or '-'} {e.result}" for e in listed
        ],
        **({"unlisted": unlisted} if unlisted else {}),
    )
