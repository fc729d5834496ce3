"""Versioned schema migrations for the hub's store (SQLite and PostgreSQL).

The database records the versions it has in `schema_migrations`. `migrate(engine)` applies the
missing ones in order, each in its own transaction that first takes a database-wide lock, so
two hubs starting at once apply every version exactly once. A database made by the old
`create_all` code (the tables, no `schema_migrations`) is adopted as version 1 without touching
its rows. A database newer than this code is refused: there are no down-migrations.

Each migration is frozen once released: it spells out its own DDL and never imports the
store's models, which describe the latest schema only. To change the schema, append a
`Migration` to `MIGRATIONS` and change the models in `hub/storetables.py` to match (docs/store.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    DateTime,
    Engine,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    bindparam,
    func,
    inspect,
    select,
    text,
    update,
)

from hub import migration_steps as steps
from hub.errors import HubError

log = structlog.get_logger(__name__)

#: Key of the PostgreSQL advisory lock that serialises migrations (any constant bigint works;
#: this one is "gpufedmg" in ASCII so it is recognisable in pg_locks).
ADVISORY_LOCK_KEY = 0x6770756665646D67


#: The tables the old `create_all` code made: all present and unversioned means version 1.
_LEGACY_TABLES = frozenset({"workloads", "decisions", "spokes"})

_metadata = MetaData()
schema_migrations = Table(
    "schema_migrations",
    _metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
    Column("name", String, nullable=False),
    Column("applied_at", DateTime(timezone=True), nullable=False),
)


class MigrationError(HubError):
    """The database schema cannot be brought to this code's version; a person must act."""

    code = "schema_migration"


@dataclass(frozen=True)
class Migration:
    """One step of the schema: `apply` runs inside the migration's transaction."""

    version: int
    name: str
    apply: Callable[[Connection], None]


def migrate(engine: Engine) -> list[int]:
    """Bring the database to the latest schema version; return the versions applied now.

    Idempotent: on an up-to-date database it applies nothing and returns `[]`. Safe to call
    from several processes at once (each migration takes a lock: `pg_advisory_xact_lock` on
    PostgreSQL, `BEGIN IMMEDIATE` on SQLite). Adopting a legacy database as version 1 is not
    an application and is not in the result. Raises `MigrationError` for a database newer than
    this code or one that has some of the hub's tables but not all of them.
    """
    applied: list[int] = []
    while True:
        with _locked(engine) as conn:
            schema_migrations.create(conn, checkfirst=True)
            current = _current_version(conn)
            if current > LATEST_VERSION:
                raise MigrationError(
                    f"the database schema is at version {current} but this gpufed knows "
                    f"versions up to {LATEST_VERSION}: run a newer gpufed against it "
                    "(schema downgrades are not supported)"
                )
            pending = [m for m in MIGRATIONS if m.version > current]
            if not pending:
                return applied
            step = pending[0]
            step.apply(conn)
            _record(conn, step)
            applied.append(step.version)
        log.info("schema_migrated", version=step.version, name=step.name)


def current_version(engine: Engine) -> int:
    """The schema version the database is at (0 for an empty one); changes nothing."""
    with engine.connect() as conn:
        if not inspect(conn).has_table(schema_migrations.name):
            return 1 if _is_legacy(conn) else 0
        version = conn.execute(select(func.max(schema_migrations.c.version))).scalar()
        return int(version) if version is not None else (1 if _is_legacy(conn) else 0)


# --- locking and bookkeeping ---


@contextmanager
def _locked(engine: Engine) -> Iterator[Connection]:
    """A connection inside a transaction that no other migrator can be in at the same time."""
    if engine.dialect.name == "sqlite":
        # pysqlite's implicit transactions neither take the write lock up front nor cover DDL,
        # so drive the transaction ourselves: autocommit at the driver, explicit BEGIN IMMEDIATE.
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.exec_driver_sql("ROLLBACK")
                raise
            conn.exec_driver_sql("COMMIT")
    elif engine.dialect.name == "postgresql":
        with engine.connect() as conn, conn.begin():
            conn.execute(select(func.pg_advisory_xact_lock(ADVISORY_LOCK_KEY)))
            yield conn
    else:
        raise MigrationError(
            f"unsupported store database {engine.dialect.name!r}: use sqlite or postgresql"
        )


def _current_version(conn: Connection) -> int:
    version = conn.execute(select(func.max(schema_migrations.c.version))).scalar()
    if version is not None:
        return int(version)
    if _is_legacy(conn):
        # Made by create_all before migrations existed: exactly version 1's tables.
        conn.execute(
            schema_migrations.insert().values(
                version=1, name="adopted from create_all", applied_at=datetime.now(UTC)
            )
        )
        log.info("schema_adopted", version=1)
        return 1
    return 0


def _is_legacy(conn: Connection) -> bool:
    present = _LEGACY_TABLES & set(inspect(conn).get_table_names())
    if present and present != _LEGACY_TABLES:
        raise MigrationError(
            f"the database has the hub tables {sorted(present)} but not "
            f"{sorted(_LEGACY_TABLES - present)} and no schema_migrations table: it was not "
            "made by gpufed, or was damaged; point the hub at an empty database or restore it"
        )
    return bool(present)


def _record(conn: Connection, step: Migration) -> None:
    conn.execute(
        schema_migrations.insert().values(
            version=step.version, name=step.name, applied_at=datetime.now(UTC)
        )
    )


# --- the migrations, oldest first; never edit a released one ---


def _v1_tables(conn: Connection) -> None:
    """workloads, decisions and spokes as the first release made them."""
    metadata = MetaData()
    workloads = Table(
        "workloads",
        metadata,
        Column("id", String, primary_key=True),
        Column("team", String, nullable=False),
        Column("phase", String, nullable=False),
        Column("submitted_at", Float, nullable=False),
        Column("data", String, nullable=False),
    )
    decisions = Table(
        "decisions",
        metadata,
        Column("decision_id", String, primary_key=True),
        Column("workload_id", String, nullable=False),
        Column("spoke_id", String, nullable=False),
        Column("subject", String, nullable=False),
        Column("payload", LargeBinary, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("published", Boolean, nullable=False),
    )
    spokes = Table(
        "spokes",
        metadata,
        Column("id", String, primary_key=True),
        Column("region", String, nullable=False),
        Column("kind", String, nullable=False),
        Column("first_seen", Float, nullable=False),
        Column("last_seen", Float, nullable=False),
        Column("report", String, nullable=True),
    )
    for table in (workloads, decisions, spokes):
        table.create(conn)
    for index in (
        Index("ix_workloads_team", workloads.c.team),
        Index("ix_workloads_phase", workloads.c.phase),
        Index("ix_workloads_submitted_at", workloads.c.submitted_at),
        Index("ix_decisions_workload_id", decisions.c.workload_id),
        Index("ix_decisions_published", decisions.c.published),
    ):
        index.create(conn)


def _v2_spoke_column_and_outbox_index(conn: Connection) -> None:
    """workloads.spoke_id (backfilled from the JSON) and an index for the unpublished scan."""
    metadata = MetaData()
    workloads = Table(
        "workloads",
        metadata,
        Column("id", String, primary_key=True),
        Column("data", String),
        Column("spoke_id", String, nullable=True),
    )
    decisions = Table(
        "decisions", metadata, Column("published", Boolean), Column("created_at", Float)
    )
    conn.execute(text("ALTER TABLE workloads ADD COLUMN spoke_id VARCHAR"))
    Index("ix_workloads_spoke_id", workloads.c.spoke_id).create(conn)
    # unpublished() filters on published and orders by created_at; this index serves both,
    # and makes the single-column one redundant.
    Index(
        "ix_decisions_published_created_at", decisions.c.published, decisions.c.created_at
    ).create(conn)
    conn.execute(text("DROP INDEX ix_decisions_published"))
    _backfill_spoke_ids(conn, workloads)


def _backfill_spoke_ids(conn: Connection, workloads: Table) -> None:
    # Keyset batches keep memory flat however many workloads there are.
    set_spoke = (
        update(workloads)
        .where(workloads.c.id == bindparam("row_id"))
        .values(spoke_id=bindparam("row_spoke_id"))
    )
    last_id = ""
    filled = 0
    while True:
        rows = conn.execute(
            select(workloads.c.id, workloads.c.data)
            .where(workloads.c.id > last_id)
            .order_by(workloads.c.id)
            .limit(steps.BACKFILL_BATCH)
        ).all()
        if not rows:
            break
        batch = [
            {"row_id": row_id, "row_spoke_id": spoke_id}
            for row_id, data in rows
            if (spoke_id := _spoke_id_in(data)) is not None
        ]
        if batch:
            conn.execute(set_spoke, batch)
            filled += len(batch)
        last_id = rows[-1][0]
    log.info("schema_backfilled", table="workloads", column="spoke_id", rows=filled)


def _spoke_id_in(data: str) -> str | None:
    # Read the stored JSON as it is, not through WorkloadRecord: the model may have moved on.
    try:
        record: Any = json.loads(data)
    except ValueError:
        return None
    spoke_id = record.get("spoke_id") if isinstance(record, dict) else None
    return spoke_id if isinstance(spoke_id, str) else None


def _v3_burst_instances(conn: Connection) -> None:
    """burst_instances: the latest InstanceEvent of every cloud instance burst launched."""
    metadata = MetaData()
    table = Table(
        "burst_instances",
        metadata,
        Column("burst_id", String, primary_key=True),
        Column("team", String, nullable=False),
        Column("state", String, nullable=False),
        Column("updated_at", Float, nullable=False),
        Column("data", String, nullable=False),
    )
    table.create(conn)
    Index("ix_burst_instances_team", table.c.team).create(conn)


def _v4_settings(conn: Connection) -> None:
    """hub_settings: named documents the hub keeps (the policy set through the API)."""
    Table(
        "hub_settings",
        MetaData(),
        Column("key", String, primary_key=True),
        Column("value", String, nullable=False),
        Column("updated_at", Float, nullable=False),
    ).create(conn)


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "workloads, decisions and spokes", _v1_tables),
    Migration(
        2,
        "workloads.spoke_id and the unpublished-decisions index",
        _v2_spoke_column_and_outbox_index,
    ),
    Migration(3, "burst_instances", _v3_burst_instances),
    Migration(4, "hub_settings", _v4_settings),
    Migration(5, "attempts (backfilled from workload history)", steps.v5_attempts),
    Migration(6, "instance_bills", steps.v6_instance_bills),
    Migration(7, "api_tokens, audit_log, burst_spend, burst_accrual", steps.v7_tokens_audit_spend),
    Migration(
        8,
        "drop burst_spend and burst_accrual; index attempts and bills by end",
        steps.v8_usage_windows,
    ),
    Migration(
        9,
        "decisions as an outbox: published ones deleted, the workload_id index dropped",
        steps.v9_decisions_outbox,
    ),
    Migration(10, "workloads.finished_at (indexed, backfilled)", steps.v10_finished_at),
    Migration(11, "audit_log.via", steps.v11_audit_via),
)
LATEST_VERSION = MIGRATIONS[-1].version
