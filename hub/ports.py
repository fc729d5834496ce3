"""The hub's ports: what the service needs from the outside, as small protocols.

`hub.store.Store` (SQLite or PostgreSQL) implements `Store`. Every method blocks and is one
short transaction: the service calls them off the event loop, one at a time (`HubState.db`),
and never holds one across a network call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from hub.authstore import AuditEntry
from hub.records import DecisionRecord, SpokeRecord, WorkloadRecord
from hub.usage import InstanceBill
from schemas import Phase
from schemas.burst import InstanceEvent


class Store(Protocol):
    """Durable state of the hub: the source of truth the in-memory view is rebuilt from."""

    def save(
        self,
        workloads: Iterable[WorkloadRecord] = (),
        decisions: Iterable[DecisionRecord] = (),
        audits: Iterable[AuditEntry] = (),
    ) -> None:
        """Insert or update workloads (with every attempt) and decisions, and append audit
        entries, in one transaction.

        Idempotent for workloads and decisions: keyed by workload id, (workload id, epoch) and
        decision id; audit entries are appended. Returns once committed; on error nothing of
        the batch is written.
        """

    def down(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by one of these methods, says the store cannot answer now (its
        disk failing or full, its server down or failing over), not that the call was wrong."""

    def get(self, workload_id: str) -> WorkloadRecord | None:
        """The workload with this id, attempts included; None if there is none."""

    def get_many(self, workload_ids: Sequence[str]) -> list[WorkloadRecord]:
        """The workloads of these ids that there are, attempts included, in any order."""

    def active(self) -> list[WorkloadRecord]:
        """Every workload not in a terminal phase, oldest submission first."""

    def find(
        self,
        *,
        team: str | None = None,
        teams: Sequence[str] | None = None,
        phases: Sequence[Phase] = (),
        limit: int = 500,
        since: float | None = None,
    ) -> list[WorkloadRecord]:
        """Workloads of `team` (any if None) in `phases` (any if empty), newest first.

        `teams`, when given, keeps only workloads of those teams (an empty list: none);
        `since`, when given, only those submitted at or after it.

        At most `limit`; an unknown team or a phase nobody is in gives an empty list.
        """

    def used_between(
        self, since: float, until: float, teams: Sequence[str] | None = None
    ) -> list[WorkloadRecord]:
        """Workloads (every attempt included) with an attempt placed before `until` that had
        not ended before `since`, of `teams` when given; oldest submission first. A superset
        of the work that ran inside the window: `hub.usage` counts the exact overlap."""

    def remove_finished(self, before: float, limit: int) -> int:
        """Remove up to `limit` workloads that ended before `before` (the longest ended first)
        with their attempts; return how many went. Never a live workload. When any went,
        `removed_before` is `before` (or a later one's) from that transaction on."""

    def removed_before(self) -> float | None:
        """The latest `before` of a `remove_finished` that removed workloads: the runs of
        workloads that ended before it may be gone. None while none was removed."""

    def mark_published(self, decision_ids: Iterable[str] = ()) -> None:
        """Mark these decisions, and those left by `mark_published_later`, published now.
        Idempotent; unknown ids are ignored."""

    def mark_published_later(self, decision_ids: Iterable[str]) -> None:
        """Mark these decisions published with the next `save` or `mark_published`, in its
        transaction. No I/O; until then they count as unpublished (a crash re-sends them)."""

    def pending_marks(self) -> int:
        """How many decisions `mark_published_later` left for the next write."""

    def unpublished(self) -> list[DecisionRecord]:
        """Decisions saved but not marked published, oldest first (re-sent at start-up)."""

    def put_setting(self, key: str, value: str, at: float) -> None:
        """Set the named document `key` (insert or replace; idempotent)."""

    def get_setting(self, key: str) -> str | None:
        """The document named `key`; None if it was never set."""

    def save_instance(self, event: InstanceEvent) -> None:
        """Keep `event` as the latest of its burst instance (idempotent: keyed by burst id)."""

    def instances(self) -> list[InstanceEvent]:
        """The latest event of every burst instance ever recorded, oldest change first."""

    def save_bill(self, bill: InstanceBill) -> None:
        """Insert or update an instance's bill (idempotent: keyed by its burst id)."""

    def bills(
        self,
        since: float | None = None,
        until: float | None = None,
        teams: Sequence[str] | None = None,
    ) -> list[InstanceBill]:
        """Instance bills, oldest request first: all of them by default; with `since` and/or
        `until`, only those whose life [requested, ended or open) reaches into the window;
        with `teams`, only theirs (an empty list: none)."""

    def save_spokes(self, spokes: Iterable[SpokeRecord]) -> None:
        """Insert or update spokes, in one transaction (idempotent: keyed by their ids)."""

    def spokes(self) -> list[SpokeRecord]:
        """Every spoke ever saved, by id (an empty list for a new store)."""

    def checkpoint(self) -> tuple[int, int] | None:
        """Copy SQLite's write-ahead log into the database file beside the writer; the log's
        pages and those copied. None for a database that needs no checkpoints."""

    def ping(self) -> None:
        """Return if the database answers; raise otherwise."""

    def close(self) -> None:
        """Release connections; the store is not usable afterwards."""
