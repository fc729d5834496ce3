"""The hub's store: sqlmodel over SQLite (embedded default) or PostgreSQL.

Records are kept whole as JSON beside the few columns we query by, so adding a field to a
record needs no table change. Every method is one short transaction; none is held across a
network call. Methods block: the service calls them on its store thread (`hub.dbworker`).

The tables (`hub.storetables`) describe the latest schema; `hub.migrations` creates and
upgrades it (docs/store.md). Change both together.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy import Connection, Engine, delete, insert, text, update
from sqlmodel import Session, col, select

from hub.authstore import AuditEntry
from hub.core.lifecycle import Attempt
from hub.engine import checkpoint, engine_for
from hub.engine import down as engine_down
from hub.migrations import migrate
from hub.records import DecisionRecord, SpokeRecord, WorkloadRecord
from hub.storetables import (
    AttemptRow,
    BurstInstanceRow,
    DecisionRow,
    InstanceBillRow,
    SettingRow,
    SpokeRow,
    WorkloadRow,
)
from hub.storewrites import (
    ATTEMPT_ADAPTER,
    Kept,
    Statements,
    attempt_rows,
    audit_row,
    decision_row,
    transaction,
    workload_row,
)
from hub.usage import InstanceBill
from schemas import CapacityReport, Phase
from schemas.burst import InstanceEvent

log = structlog.get_logger(__name__)

_TERMINAL = [p.value for p in Phase if p.terminal]
#: Workload ids per query when many workloads or their attempts are read (bound parameters).
_IDS_A_QUERY = 500
#: The setting that keeps `remove_finished`'s latest `before` that removed anything.
_REMOVED_BEFORE = "ended_removed_before"


class Store:
    """Persistence of workloads, decisions, spokes and burst instances."""

    def __init__(self, url: str) -> None:
        """Connect to `url` and bring its schema up to date (see `hub.migrations.migrate`).

        `url` is SQLAlchemy's: `sqlite:///path` or `postgresql+psycopg://user:pw@host:port/db`
        (plain `postgresql://` means psycopg too). Raises `MigrationError` for a database
        newer than this code.
        """
        self.url = url
        self.engine: Engine = engine_for(url)
        migrate(self.engine)
        # What `checkpoint` runs on: for SQLite a connection of its own, so the writer's keeps
        # its pages (`hub.engine`).
        sqlite = self.engine.dialect.name == "sqlite"
        self.checkpoint_engine = engine_for(url, one_connection=True) if sqlite else self.engine
        self._sql = Statements.of(self.engine)
        # What each live workload's saves keep between them (`Kept`): its spec and history as
        # JSON, its attempts as last committed. Forgotten when it ends.
        self._kept: dict[str, Kept] = {}
        self._marks: list[str] = []  # decisions to mark published with the next write
        self._marks_lock = threading.Lock()  # marks are left on the event loop's thread

    @classmethod
    def sqlite(cls, path: Path) -> Store:
        """A store in the SQLite file `path` (its folder is created)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(f"sqlite:///{path}")

    def down(self, exc: BaseException) -> bool:
        """Whether `exc`, raised by one of these calls, says the database cannot answer now."""
        return engine_down(self.engine, exc)

    def close(self) -> None:
        """Close the pooled connections (the store is not usable afterwards)."""
        self.engine.dispose()
        self.checkpoint_engine.dispose()

    # --- workloads ---

    def save(
        self,
        workloads: Iterable[WorkloadRecord] = (),
        decisions: Iterable[DecisionRecord] = (),
        audits: Iterable[AuditEntry] = (),
    ) -> None:
        """Insert or update workloads (with each attempt that changed since this store last
        committed it: `attempt_rows`) and decisions, and append audit entries, in one
        transaction; the marks left by `mark_published_later` go with it.

        Idempotent for workloads and decisions: keyed by workload id, (workload id, epoch) and
        decision id. An audit entry saved with what it records costs no transaction of its own.
        """
        rows = []
        changed: list[tuple[Any, ...]] = []
        kept = self._kept
        saved: list[tuple[str, Kept, tuple[Attempt, ...], bool]] = []
        for w in workloads:
            parts = kept.get(w.id)
            if parts is None:
                parts = kept[w.id] = Kept()
            rows.append(workload_row(w, parts))
            attempts = w.attempts  # read once: what is written is what is noted below
            changed.extend(attempt_rows(w.id, attempts, parts.attempts))
            saved.append((w.id, parts, attempts, w.phase.terminal))
        decision_rows = [decision_row(d) for d in decisions]
        audit_rows = [audit_row(e) for e in audits]
        # Upserts, not ORM merges: the hub writes on every submission and event, and a merge
        # costs a SELECT per row before its write.
        try:
            self._write(rows, changed, decision_rows, audit_rows)
        except BaseException:
            # Nothing kept of them stays: a new workload the cycle then drops is never saved
            # again, and would stay kept for good; the others' next save writes every attempt.
            for workload_id, _, _, _ in saved:
                kept.pop(workload_id, None)
            raise
        # Attempts noted only once committed.
        for workload_id, parts, attempts, ended in saved:
            if ended:
                kept.pop(workload_id, None)
            else:
                parts.attempts = attempts

    def _write(self, *rows: list[tuple[Any, ...]]) -> None:
        workloads, attempts, decisions, audits = rows
        with self._marks_lock:
            marks, self._marks = self._marks, []
        sql = self._sql
        try:
            with transaction(self.engine) as cursor:
                if workloads:
                    cursor.executemany(sql.workload, workloads)
                if attempts:
                    cursor.executemany(sql.attempt, attempts)
                if decisions:
                    cursor.executemany(sql.decision, decisions)
                if audits:
                    cursor.executemany(sql.audit, audits)
                if marks:
                    cursor.executemany(sql.published, [(m,) for m in marks])
        except BaseException:
            with self._marks_lock:  # kept for the next write
                self._marks[:0] = marks
            raise

    def get(self, workload_id: str) -> WorkloadRecord | None:
        """The workload with this id, or None if there is none."""
        with Session(self.engine) as session:
            row = session.get(WorkloadRow, workload_id)
            return None if row is None else self._with_attempts(session, [row])[0]

    def get_many(self, workload_ids: Sequence[str]) -> list[WorkloadRecord]:
        """The workloads of these ids that there are, in any order (a keyed batch's lookup)."""
        found: list[WorkloadRecord] = []
        with Session(self.engine) as session:
            for at in range(0, len(workload_ids), _IDS_A_QUERY):
                some = list(workload_ids[at : at + _IDS_A_QUERY])
                rows = session.exec(select(WorkloadRow).where(col(WorkloadRow.id).in_(some)))
                found += self._with_attempts(session, rows.all())
        return found

    def active(self) -> list[WorkloadRecord]:
        """Every workload not in a terminal phase, oldest first."""
        with Session(self.engine) as session:
            rows = session.exec(
                select(WorkloadRow)
                .where(col(WorkloadRow.phase).not_in(_TERMINAL))
                .order_by(col(WorkloadRow.submitted_at))
            ).all()
            return self._with_attempts(session, rows)

    def active_on_spoke(self, spoke_id: str) -> list[WorkloadRecord]:
        """Every workload not in a terminal phase whose spoke is `spoke_id`, oldest first.

        An unknown spoke has none (empty list).
        """
        with Session(self.engine) as session:
            rows = session.exec(
                select(WorkloadRow)
                .where(WorkloadRow.spoke_id == spoke_id)
                .where(col(WorkloadRow.phase).not_in(_TERMINAL))
                .order_by(col(WorkloadRow.submitted_at))
            ).all()
            return self._with_attempts(session, rows)

    def find(
        self,
        *,
        team: str | None = None,
        teams: Sequence[str] | None = None,
        phases: Sequence[Phase] = (),
        limit: int = 500,
        since: float | None = None,
    ) -> list[WorkloadRecord]:
        """Workloads, newest first; of `team`, or of `teams` when given (None: every team);
        submitted at or after `since` when given."""
        with Session(self.engine) as session:
            query = select(WorkloadRow)
            if since is not None:
                query = query.where(col(WorkloadRow.submitted_at) >= since)
            if team:
                query = query.where(WorkloadRow.team == team)
            if teams is not None:
                query = query.where(col(WorkloadRow.team).in_(list(teams)))
            if phases:
                query = query.where(col(WorkloadRow.phase).in_([p.value for p in phases]))
            query = query.order_by(col(WorkloadRow.submitted_at).desc()).limit(limit)
            return self._with_attempts(session, session.exec(query).all())

    def used_between(
        self, since: float, until: float, teams: Sequence[str] | None = None
    ) -> list[WorkloadRecord]:
        """Workloads with an attempt placed before `until` and not ended before `since` (open
        ones included), of `teams` when given; every attempt of each, oldest submission first.

        Filtered in SQL on the attempts' time columns (indexed), so a usage window reads the
        work of that window, not the whole history.
        """
        with Session(self.engine) as session:
            overlapping = (
                select(AttemptRow.workload_id)
                .where(col(AttemptRow.placed_at) < until)
                .where(col(AttemptRow.ended_at).is_(None) | (col(AttemptRow.ended_at) >= since))
            )
            query = select(WorkloadRow).where(col(WorkloadRow.id).in_(overlapping))
            if teams is not None:
                query = query.where(col(WorkloadRow.team).in_(list(teams)))
            query = query.order_by(col(WorkloadRow.submitted_at))
            return self._with_attempts(session, session.exec(query).all())

    def remove_finished(self, before: float, limit: int) -> int:
        """Remove up to `limit` workloads that ended before `before`, the longest ended first,
        with their attempts, in one transaction; return how many went. A live workload is
        never one of them (its `finished_at` is NULL)."""
        workloads, attempts = WorkloadRow.__table__, AttemptRow.__table__  # type: ignore[attr-defined]
        with self.engine.begin() as conn:
            ids = list(
                conn.execute(
                    select(workloads.c.id)
                    .where(workloads.c.finished_at < before)
                    .order_by(workloads.c.finished_at)
                    .limit(limit)
                ).scalars()
            )
            if ids:
                conn.execute(delete(attempts).where(attempts.c.workload_id.in_(ids)))
                conn.execute(delete(workloads).where(workloads.c.id.in_(ids)))
                _note_removed(conn, before)
        return len(ids)

    def removed_before(self) -> float | None:
        return _float(self.get_setting(_REMOVED_BEFORE))

    def _with_attempts(self, session: Session, rows: Sequence[WorkloadRow]) -> list[WorkloadRecord]:
        attempts: dict[str, list[Attempt]] = defaultdict(list)
        ids = [r.id for r in rows]
        for start in range(0, len(ids), _IDS_A_QUERY):
            batch = ids[start : start + _IDS_A_QUERY]
            query = (
                select(AttemptRow)
                .where(col(AttemptRow.workload_id).in_(batch))
                .order_by(col(AttemptRow.workload_id), col(AttemptRow.epoch))
            )
            for stored in session.exec(query):
                attempts[stored.workload_id].append(ATTEMPT_ADAPTER.validate_json(stored.data))
        records = []
        for row in rows:
            record = WorkloadRecord.model_validate_json(row.data)
            record.attempts = tuple(attempts.get(row.id, ()))
            records.append(record)
        return records

    # --- decisions ---

    def mark_published(self, decision_ids: Iterable[str] = ()) -> None:
        """Mark these decisions, and those left by `mark_published_later`, published now:
        they leave the table, an outbox of what may still need sending (idempotent; unknown
        ids are ignored)."""
        self.mark_published_later(decision_ids)
        if self.pending_marks():
            self._write([], [], [], [])

    def mark_published_later(self, decision_ids: Iterable[str]) -> None:
        """Mark these decisions published with the next write (no I/O of its own).

        Until then they count as unpublished: a crash sends them again under the same ids, and
        the bus drops the copies."""
        with self._marks_lock:
            self._marks.extend(decision_ids)

    def pending_marks(self) -> int:
        """How many marks wait for the next write."""
        return len(self._marks)

    def unpublished(self) -> list[DecisionRecord]:
        """Decisions persisted but maybe not published (re-sent at start-up)."""
        with Session(self.engine) as session:
            rows = session.exec(
                select(DecisionRow)
                .where(col(DecisionRow.published).is_(False))
                .order_by(col(DecisionRow.created_at))
            ).all()
            return [DecisionRecord.model_validate(r.model_dump()) for r in rows]

    # --- settings ---

    def put_setting(self, key: str, value: str, at: float) -> None:
        with Session(self.engine) as session:
            session.merge(SettingRow(key=key, value=value, updated_at=at))
            session.commit()

    def get_setting(self, key: str) -> str | None:
        with Session(self.engine) as session:
            row = session.get(SettingRow, key)
            return None if row is None else row.value

    # --- burst instances ---

    def save_instance(self, event: InstanceEvent) -> None:
        """Keep the latest event of a burst instance (idempotent)."""
        with Session(self.engine) as session:
            session.merge(
                BurstInstanceRow(
                    burst_id=event.burst_id,
                    team=event.team,
                    state=event.state.value,
                    updated_at=event.at,
                    data=event.model_dump_json(),
                )
            )
            session.commit()

    def instances(self) -> list[InstanceEvent]:
        """The latest event of every burst instance, oldest change first."""
        with Session(self.engine) as session:
            rows = session.exec(
                select(BurstInstanceRow).order_by(col(BurstInstanceRow.updated_at))
            ).all()
            return [InstanceEvent.model_validate_json(r.data) for r in rows]

    def save_bill(self, bill: InstanceBill) -> None:
        """Insert or update an instance's bill (idempotent: keyed by its burst id)."""
        with Session(self.engine) as session:
            session.merge(
                InstanceBillRow(
                    burst_id=bill.burst_id,
                    team=bill.team,
                    requested_at=bill.requested_at,
                    ended_at=bill.ended_at,
                    data=bill.model_dump_json(),
                )
            )
            session.commit()

    def bills(
        self,
        since: float | None = None,
        until: float | None = None,
        teams: Sequence[str] | None = None,
    ) -> list[InstanceBill]:
        """Instance bills, oldest request first: every one, or those requested before `until`
        and not ended before `since` (filtered in SQL), of `teams` when given."""
        with Session(self.engine) as session:
            query = select(InstanceBillRow)
            if until is not None:
                query = query.where(col(InstanceBillRow.requested_at) < until)
            if since is not None:
                ended = col(InstanceBillRow.ended_at)
                query = query.where(ended.is_(None) | (ended >= since))
            if teams is not None:
                query = query.where(col(InstanceBillRow.team).in_(list(teams)))
            rows = session.exec(query.order_by(col(InstanceBillRow.requested_at))).all()
            return [InstanceBill.model_validate_json(r.data) for r in rows]

    # --- spokes ---

    def save_spokes(self, spokes: Iterable[SpokeRecord]) -> None:
        """Insert or update spokes, in one transaction (idempotent: keyed by their ids)."""
        with Session(self.engine) as session:
            for spoke in spokes:
                session.merge(
                    SpokeRow(
                        id=spoke.id,
                        region=spoke.region,
                        kind=spoke.kind,
                        first_seen=spoke.first_seen,
                        last_seen=spoke.last_seen,
                        report=spoke.report.model_dump_json() if spoke.report else None,
                    )
                )
            session.commit()

    def spokes(self) -> list[SpokeRecord]:
        """Every spoke ever heard of, by id."""
        with Session(self.engine) as session:
            rows = session.exec(select(SpokeRow).order_by(col(SpokeRow.id))).all()
            return [
                SpokeRecord(
                    id=r.id,
                    region=r.region,
                    kind=r.kind,
                    first_seen=r.first_seen,
                    last_seen=r.last_seen,
                    report=CapacityReport.model_validate_json(r.report) if r.report else None,
                )
                for r in rows
            ]

    def checkpoint(self) -> tuple[int, int] | None:
        """SQLite's log copied into the database file, beside the writer (`hub.engine`)."""
        return checkpoint(self.checkpoint_engine)

    def ping(self) -> None:
        """Raise if the database cannot be reached."""
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))


def _note_removed(conn: Connection, before: float) -> None:
    """`before` as the removed workloads' bound, in their transaction, unless a later one is
    (its `updated_at` too: the store keeps no clock)."""
    settings = SettingRow.__table__  # type: ignore[attr-defined]
    key = settings.c.key == _REMOVED_BEFORE
    kept = _float(conn.execute(select(settings.c.value).where(key)).scalar())
    if kept is None:
        conn.execute(
            insert(settings).values(key=_REMOVED_BEFORE, value=repr(before), updated_at=before)
        )
    elif kept < before:
        conn.execute(update(settings).where(key).values(value=repr(before), updated_at=before))


def _float(value: str | None) -> float | None:
    return None if value is None else float(value)
