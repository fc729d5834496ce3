"""The store's hot writes, on the database driver's connection with SQL written once.

The hub saves on every submission, cycle and batch of events. Through SQLAlchemy Core each
statement cost its compile-cache lookup, parameter processing and result set-up, and each
transaction its connection wrapper; here a save is one pooled DBAPI connection (checked out as
before: PostgreSQL's pre-ping still replaces a dropped one), `executemany` of plain tuples and
a commit. The statements are the same upserts on SQLite and PostgreSQL; only the placeholder
differs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from hub.authstore import AuditEntry
from hub.core.lifecycle import Attempt
from hub.records import DecisionRecord, WorkloadRecord
from schemas import WorkloadSpec

ATTEMPT_ADAPTER: TypeAdapter[Attempt] = TypeAdapter(Attempt)
#: Left out of a workload row's JSON: its attempts (their own table) and what is derived from
#: them (the computed fields, recomputed on load): serialising those was a third of a save.
#: The spec is written from its JSON kept by the store (a spec never changes: it is frozen,
#: and replaced whole when edited), not serialised again on every save.
NOT_STORED = frozenset({"attempts", *WorkloadRecord.model_computed_fields})
_NOT_DUMPED = NOT_STORED | {"spec"}


def _upsert(
    table: str, columns: Sequence[str], keys: Sequence[str], mark: str, fixed: Sequence[str] = ()
) -> str:
    """An insert that updates the row its keys name, all but the keys and the `fixed` columns
    (never changed once written): SQLite rewrites the index entries of every column an UPDATE
    sets, even to the same value."""
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns if c not in (*keys, *fixed))
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(mark for _ in columns)})"
        f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}"
    )


@dataclass(frozen=True)
class Statements:
    """The hot statements in one dialect's placeholder style."""

    workload: str
    attempt: str
    decision: str
    audit: str
    published: str  # a published decision leaves the outbox

    @classmethod
    def of(cls, engine: Engine) -> Statements:
        mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
        audit_columns = ("at", "actor", "role", "action", "team", "target", "result", "detail")
        return cls(
            workload=_upsert(
                "workloads",
                ("id", "team", "phase", "submitted_at", "spoke_id", "data"),
                ("id",),
                mark,
                fixed=("team", "submitted_at"),  # a workload's team and submission never change
            ),
            attempt=_upsert(
                "attempts",
                (
                    "workload_id",
                    "epoch",
                    "spoke_id",
                    "placed_at",
                    "ended_at",
                    "end_reason",
                    "data",
                ),
                ("workload_id", "epoch"),
                mark,
                fixed=("spoke_id", "placed_at"),  # an attempt's spoke and start never change
            ),
            decision=_upsert(
                "decisions",
                (
                    "decision_id",
                    "workload_id",
                    "spoke_id",
                    "subject",
                    "payload",
                    "created_at",
                    "published",
                ),
                ("decision_id",),
                mark,
            ),
            audit=(
                f"INSERT INTO audit_log ({', '.join(audit_columns)})"
                f" VALUES ({', '.join(mark for _ in audit_columns)})"
            ),
            published=f"DELETE FROM decisions WHERE decision_id = {mark}",
        )


def workload_row(w: WorkloadRecord, specs: dict[str, tuple[WorkloadSpec, str]]) -> tuple[Any, ...]:
    """The row of `w`; `specs` keeps each live workload's spec JSON between saves (and loses a
    workload's once it ends)."""
    cached = specs.get(w.id)
    if cached is None or cached[0] is not w.spec:
        cached = specs[w.id] = (w.spec, w.spec.model_dump_json())
    if w.phase.terminal:
        del specs[w.id]
    rest = w.model_dump_json(exclude=_NOT_DUMPED)  # type: ignore[arg-type]
    data = f'{rest[:-1]},"spec":{cached[1]}}}'
    return (w.id, w.spec.team, w.phase.value, w.submitted_at, w.spoke_id, data)


def attempt_rows(
    workload_id: str, attempts: tuple[Attempt, ...], written: tuple[Attempt, ...] | None
) -> list[tuple[Any, ...]]:
    """The rows of the attempts not in the store as they are: `written`, the attempts last
    committed for this workload (None: not known, so every one is written). An attempt is a
    frozen value, replaced whole when it changes, so one that is the very object committed
    last is stored already: a workload preempted forty times rewrote forty rows, each
    serialised again, on every save, where one or two changed."""
    if written is None:
        return [attempt_row(workload_id, a) for a in attempts]
    known = len(written)
    return [
        attempt_row(workload_id, a)
        for i, a in enumerate(attempts)
        if i >= known or written[i] is not a
    ]


def attempt_row(workload_id: str, attempt: Attempt) -> tuple[Any, ...]:
    return (
        workload_id,
        attempt.epoch,
        attempt.spoke_id,
        attempt.placed_at,
        attempt.ended_at,
        attempt.end_reason.value if attempt.end_reason else None,
        ATTEMPT_ADAPTER.dump_json(attempt).decode(),
    )


def decision_row(d: DecisionRecord) -> tuple[Any, ...]:
    return (
        d.decision_id,
        d.workload_id,
        d.spoke_id,
        d.subject,
        d.payload,
        d.created_at,
        d.published,
    )


def audit_row(e: AuditEntry) -> tuple[Any, ...]:
    return (e.at, e.actor, e.role, e.action, e.team, e.target, e.result, e.detail)


@contextmanager
def transaction(engine: Engine) -> Iterator[Any]:
    """A DBAPI cursor in a transaction on a pooled connection: committed when the block ends,
    rolled back if it raises. The driver's errors are raised as SQLAlchemy's (`DBAPIError`
    and its kinds), as through SQLAlchemy."""
    connection = engine.raw_connection()
    try:
        cursor = connection.cursor()
        try:
            yield cursor
            connection.commit()
        except BaseException as exc:
            try:
                connection.rollback()
            except Exception:  # the connection is broken: the pool replaces it
                connection.invalidate()
            driver_error = engine.dialect.loaded_dbapi.Error
            if isinstance(exc, driver_error):
                raise DBAPIError.instance(None, None, exc, driver_error) from exc
            raise
        finally:
            with suppress(Exception):
                cursor.close()
    finally:
        connection.close()  # back to the pool
