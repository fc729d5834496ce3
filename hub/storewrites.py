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
from hub.records import DecisionRecord, HistoryEntry, WorkloadRecord
from schemas import WorkloadSpec

ATTEMPT_ADAPTER: TypeAdapter[Attempt] = TypeAdapter(Attempt)
HISTORY_ADAPTER: TypeAdapter[list[HistoryEntry]] = TypeAdapter(list[HistoryEntry])
# Their serialisers, called as they are: `TypeAdapter.dump_json`'s own steps cost as much as
# serialising an attempt or two history entries.
_attempt_json = ATTEMPT_ADAPTER.serializer.to_json
_history_json = HISTORY_ADAPTER.serializer.to_json
#: Left out of a workload row's JSON: its attempts (their own table) and what is derived from
#: them (the computed fields, recomputed on load): serialising those was a third of a save.
#: The spec and the history are written from their JSON kept by the store (`Kept`), not
#: serialised again on every save.
NOT_STORED = frozenset({"attempts", *WorkloadRecord.model_computed_fields})
_NOT_DUMPED = NOT_STORED | {"spec", "history"}


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
        return cls(
            workload=_upsert(
                "workloads",
                ("id", "team", "phase", "submitted_at", "spoke_id", "finished_at", "data"),
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
                f"INSERT INTO audit_log ({', '.join(AUDIT_COLUMNS)})"
                f" VALUES ({', '.join(mark for _ in AUDIT_COLUMNS)})"
            ),
            published=f"DELETE FROM decisions WHERE decision_id = {mark}",
        )


class Kept:
    """What a store keeps of a live workload between its saves: its spec and the history
    entries it serialised, as JSON, and its attempts as it last committed them.

    A spec never changes (it is frozen, and replaced whole when edited), and a history is only
    appended to, or cut back by a cycle that failed to save (`hub.cycle`): a cut takes the
    last entry serialised with it, so the next save sees that entry gone and serialises the
    whole history again. Each entry is otherwise serialised once, however many times the
    workload is saved: a workload preempted forty times carries two hundred."""

    __slots__ = ("attempts", "entries", "history_json", "last", "spec", "spec_json")

    def __init__(self) -> None:
        self.spec: WorkloadSpec | None = None
        self.spec_json = ""
        self.entries = 0  # the first `entries` of the history are in `history_json`
        self.last: HistoryEntry | None = None  # the last of them, itself
        self.history_json = ""  # their objects, comma-separated, without the brackets
        self.attempts: tuple[Attempt, ...] | None = None  # None: not known (`attempt_rows`)

    def spec_of(self, spec: WorkloadSpec) -> str:
        """`spec` as JSON, serialised again only when the workload's spec was replaced."""
        if spec is not self.spec:
            self.spec, self.spec_json = spec, spec.model_dump_json()
        return self.spec_json

    def history(self, history: list[HistoryEntry]) -> str:
        """`history` as a JSON array, serialising only the entries not serialised before."""
        done = self.entries
        if done and (done > len(history) or history[done - 1] is not self.last):
            done, self.history_json = 0, ""  # cut back since
        if len(history) > done:
            new = _history_json(history[done:]).decode()[1:-1]
            self.history_json = f"{self.history_json},{new}" if done else new
            self.entries, self.last = len(history), history[-1]
        return f"[{self.history_json}]"


def workload_row(w: WorkloadRecord, kept: Kept) -> tuple[Any, ...]:
    """The row of `w`, its spec and history from what the store `kept` of it."""
    rest = w.model_dump_json(exclude=_NOT_DUMPED)  # type: ignore[arg-type]
    data = f'{rest[:-1]},"spec":{kept.spec_of(w.spec)},"history":{kept.history(w.history)}}}'
    return (w.id, w.spec.team, w.phase.value, w.submitted_at, w.spoke_id, finished_at(w), data)


def finished_at(w: WorkloadRecord) -> float | None:
    """When an ended workload ended (its submission if it has no `finished_at`), by which
    `Store.remove_finished` finds it; None while it lives."""
    if not w.phase.terminal:
        return None
    return w.finished_at if w.finished_at is not None else w.submitted_at


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
        _attempt_json(attempt).decode(),
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


#: audit_log's columns in the order `audit_row` gives them.
AUDIT_COLUMNS = ("at", "actor", "role", "action", "team", "target", "result", "detail", "via")


def audit_row(e: AuditEntry) -> tuple[Any, ...]:
    """An entry's values in AUDIT_COLUMNS' order (spelled out: a save makes one per entry)."""
    return (e.at, e.actor, e.role, e.action, e.team, e.target, e.result, e.detail, e.via)


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
