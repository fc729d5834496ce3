"""The store's schema migrations, on SQLite and on a real PostgreSQL
(tests/integration/databases.py)."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime

import pytest
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Engine,
    Float,
    LargeBinary,
    MetaData,
    Table,
    create_engine,
    inspect,
    select,
    text,
)
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

import hub.authstore  # noqa: F401  (registers the token and audit tables)
import hub.migrations as migrations
from hub import migration_steps
from hub.authstore import AuditEntry, AuthStore
from hub.core.lifecycle import Attempt, EndReason
from hub.migrations import LATEST_VERSION, MigrationError, current_version, migrate
from hub.store import Store
from hub.storewrites import ATTEMPT_ADAPTER
from schemas import Assignment, Phase
from schemas.burst import InstanceEvent, InstanceState, Market
from tests.integration.databases import decision, workload


def test_fresh_database_gets_every_version(engine: Engine) -> None:
    assert current_version(engine) == 0

    assert migrate(engine) == [m.version for m in migrations.MIGRATIONS]

    assert current_version(engine) == LATEST_VERSION
    with engine.connect() as conn:
        assert _versions(conn) == [m.version for m in migrations.MIGRATIONS]
    # Spend is read from the instance bills; the separate meter's tables are gone.
    assert not {"burst_spend", "burst_accrual"} & set(inspect(engine).get_table_names())


def test_migrating_again_changes_nothing(engine: Engine) -> None:
    migrate(engine)
    with engine.connect() as conn:
        before = conn.execute(select(migrations.schema_migrations)).all()

    assert migrate(engine) == []

    with engine.connect() as conn:
        assert conn.execute(select(migrations.schema_migrations)).all() == before


def test_models_match_the_migrated_schema(engine: Engine) -> None:
    migrate(engine)

    _assert_schema_matches_models(engine)


def test_legacy_database_is_adopted_and_upgraded_with_rows_intact(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Several backfill rounds, with a spoke-less record and unreadable JSON on the way.
    monkeypatch.setattr(migration_steps, "BACKFILL_BATCH", 2)
    records = [
        workload("w1", phase=Phase.RUNNING, spoke="s1", at=1.0),
        workload("w2", phase=Phase.QUEUED, at=2.0),
        workload("w3", phase=Phase.PLACED, spoke="s2", at=3.0),
        workload("w4", phase=Phase.SUCCEEDED, spoke="s1", at=4.0),
        workload("w5", phase=Phase.PLACED, spoke="s1", at=5.0),
    ]
    old_decision = decision("d1", at=1.0, payload=b"\x00\x01")
    _legacy.create_all(engine)
    with engine.begin() as conn:
        conn.execute(
            _legacy.tables["workloads"].insert(),
            [
                {
                    "id": r.id,
                    "team": r.spec.team,
                    "phase": r.phase.value,
                    "submitted_at": r.submitted_at,
                    # The record as the code before attempts wrote it: flat fields only.
                    "data": r.model_dump_json(exclude={"attempts"}),
                }
                for r in records
            ]
            + [{"id": "w6", "team": "t", "phase": "queued", "submitted_at": 6.0, "data": "{"}],
        )
        conn.execute(_legacy.tables["decisions"].insert(), [old_decision.model_dump()])
        conn.execute(
            _legacy.tables["spokes"].insert(),
            [{"id": "s1", "region": "r", "kind": "onprem", "first_seen": 1.0, "last_seen": 2.0}],
        )
    assert current_version(engine) == 1

    assert migrate(engine) == [m.version for m in migrations.MIGRATIONS[1:]]

    _assert_schema_matches_models(engine)
    with engine.connect() as conn:
        assert _versions(conn) == [m.version for m in migrations.MIGRATIONS]
        rows = conn.execute(text("SELECT id, spoke_id FROM workloads"))
        spoke_ids = {row_id: spoke_id for row_id, spoke_id in rows}
    assert spoke_ids == {"w1": "s1", "w2": None, "w3": "s2", "w4": "s1", "w5": "s1", "w6": None}
    store = Store(db_url)
    try:
        assert [store.get(r.id) for r in records] == records
        assert [w.id for w in store.active_on_spoke("s1")] == ["w1", "w5"]
        assert store.unpublished() == [old_decision]
        assert [s.id for s in store.spokes()] == ["s1"]
    finally:
        store.close()


def test_attempts_are_rebuilt_from_the_history_of_records_written_before_them(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As the code before attempts wrote it: placed on s1 (epoch 1), s1 was lost (fenced at
    # epoch 2), placed again on s2 under epoch 3, now running there.
    history = [
        {"at": 1.0, "event": "submitted", "epoch": 0},
        {"at": 2.0, "event": "placed", "epoch": 1, "spoke_id": "s1", "detail": "n0:0"},
        {"at": 3.0, "event": "running", "epoch": 1, "spoke_id": "s1"},
        {"at": 9.0, "event": "spoke_lost", "epoch": 1, "spoke_id": "s1", "detail": "silent"},
        {"at": 9.0, "event": "requeued", "epoch": 2},
        {"at": 10.0, "event": "placed", "epoch": 3, "spoke_id": "s2", "detail": "n1:1"},
        {"at": 11.0, "event": "running", "epoch": 3, "spoke_id": "s2"},
    ]
    old = workload("w1").model_dump(mode="json", exclude={"attempts"})
    devices = [{"node": "n1", "devices": [1], "fraction": None, "schema_version": 1}]
    old.update(
        phase="running", epoch=3, spoke_id="s2", assignments=devices, placed_at=10.0,
        started_at=11.0, command_seq=42, restarts=1, history=history,
    )  # fmt: skip
    _migrate_up_to(4, engine, monkeypatch)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO workloads (id, team, phase, submitted_at, spoke_id, data)"
                " VALUES ('w1', 'vision', 'running', 1.0, 's2', :data)"
            ),
            {"data": json.dumps(old)},
        )

    store = Store(db_url)  # migrates to the latest version
    try:
        record = store.get("w1")
    finally:
        store.close()

    assert record is not None
    lost, running = record.attempts
    assert (lost.epoch, lost.spoke_id, lost.started_at) == (1, "s1", 3.0)
    assert (lost.ended_at, lost.end_reason) == (9.0, EndReason.SPOKE_LOST)
    assert (running.epoch, running.spoke_id, running.live, running.command_seq) == (
        3,
        "s2",
        True,
        42,
    )
    assert running.assignments == (Assignment(node="n1", devices=(1,)),)
    assert (record.epoch, record.spoke_id, record.started_at) == (3, "s2", 11.0)


def test_instances_recorded_before_bills_get_one_from_their_latest_event(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _migrate_up_to(5, engine, monkeypatch)
    events = {
        "b-live": InstanceEvent(
            burst_id="b-live", provider="local", instance_type="sim", region="us-east-1",
            market=Market.SPOT, price_per_hour=3.0, team="vision",
            state=InstanceState.RUNNING, at=100.0,
        ),
        "b-gone": InstanceEvent(
            burst_id="b-gone", provider="local", instance_type="sim", region="us-east-1",
            market=Market.ON_DEMAND, price_per_hour=1.0, team="nlp",
            state=InstanceState.TERMINATED, at=50.0,
        ),
    }  # fmt: skip
    with engine.begin() as conn:
        for event in events.values():
            conn.execute(
                text(
                    "INSERT INTO burst_instances (burst_id, team, state, updated_at, data)"
                    " VALUES (:id, :team, :state, :at, :data)"
                ),
                {
                    "id": event.burst_id,
                    "team": event.team,
                    "state": event.state.value,
                    "at": event.at,
                    "data": event.model_dump_json(),
                },
            )

    store = Store(db_url)  # migrates to the latest version
    try:
        bills = {b.burst_id: b for b in store.bills()}
    finally:
        store.close()

    assert set(bills) == {"b-live", "b-gone"}
    live, gone = bills["b-live"], bills["b-gone"]
    assert (live.team, live.requested_at, live.running_at, live.ended_at) == (
        "vision", 100.0, 100.0, None,
    )  # fmt: skip
    assert (gone.team, gone.ended_at, gone.price_per_hour) == ("nlp", 50.0, 1.0)


def test_published_decisions_are_dropped_from_the_outbox(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _migrate_up_to(8, engine, monkeypatch)
    with engine.begin() as conn:
        for did, published in (("d-sent", True), ("d-waiting", False)):
            conn.execute(
                text(
                    "INSERT INTO decisions (decision_id, workload_id, spoke_id, subject, payload,"
                    " created_at, published) VALUES (:id, 'w1', 's1', 'gpufed.cmd.s1', :payload,"
                    " 1.0, :published)"
                ),
                {"id": did, "payload": b"{}", "published": published},
            )

    store = Store(db_url)  # migrates to the latest version
    try:
        assert [d.decision_id for d in store.unpublished()] == ["d-waiting"]
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM decisions")).scalar_one() == 1
        indexes = {i["name"] for i in inspect(store.engine).get_indexes("decisions")}
    finally:
        store.close()
    assert "ix_decisions_workload_id" not in indexes


def test_workloads_ended_before_the_finish_column_get_their_end_and_can_go(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _migrate_up_to(9, engine, monkeypatch)
    rows = [  # id, phase, submitted_at, (epoch, ended_at) of its attempts
        ("w-done", "succeeded", 1.0, [(1, 50.0)]),
        ("w-never-ran", "cancelled", 7.0, []),  # cancelled in the queue: its submission
        ("w-requeued", "failed", 2.0, [(1, 400.0), (2, 500.0)]),  # its last attempt's end
        ("w-running", "running", 3.0, [(1, 20.0), (2, None)]),
    ]
    with engine.begin() as conn:
        for wid, phase, submitted, attempts in rows:
            data = workload(wid).model_dump(mode="json", exclude={"attempts"})
            data.update(phase=phase, submitted_at=submitted)
            conn.execute(
                text(
                    "INSERT INTO workloads (id, team, phase, submitted_at, spoke_id, data)"
                    " VALUES (:id, 'vision', :phase, :at, NULL, :data)"
                ),
                {"id": wid, "phase": phase, "at": submitted, "data": json.dumps(data)},
            )
            for epoch, ended_at in attempts:
                conn.execute(
                    text(
                        "INSERT INTO attempts (workload_id, epoch, spoke_id, placed_at, ended_at,"
                        " end_reason, data) VALUES (:id, :epoch, 's1', 1.0, :ended, NULL, :data)"
                    ),
                    {
                        "id": wid,
                        "epoch": epoch,
                        "ended": ended_at,
                        "data": _attempt(epoch, ended_at),
                    },
                )

    store = Store(db_url)  # migrates to the latest version
    try:
        with store.engine.connect() as conn:
            stamped = conn.execute(text("SELECT id, finished_at FROM workloads ORDER BY id"))
            assert {row[0]: row[1] for row in stamped} == {
                "w-done": 50.0, "w-never-ran": 7.0, "w-requeued": 500.0, "w-running": None,
            }  # fmt: skip
        assert store.remove_finished(before=100.0, limit=10) == 2
        assert {w.id for w in store.find()} == {"w-requeued", "w-running"}
    finally:
        store.close()


def test_audit_entries_written_before_the_via_column_keep_their_rows(
    db_url: str, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _migrate_up_to(10, engine, monkeypatch)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO audit_log (at, actor, role, action, team, target, result, detail)"
                " VALUES (5.0, 'mia', 'member', 'submit', 'vision', 'w1', 'ok', 'old')"
            )
        )
    store = Store(db_url)  # migrates to the latest version
    try:
        auth = AuthStore(store.engine)
        (old,) = auth.audit()
        assert (old.actor, old.detail, old.via) == ("mia", "old", "")
        new = AuditEntry(at=6.0, actor="bo", role="admin", action="x", result="ok", via="token:t1")
        auth.append_audits([new])
        assert [e.actor for e in auth.audit(via="token:t1")] == ["bo"]
    finally:
        store.close()


def test_database_newer_than_the_code_is_refused(db_url: str, engine: Engine) -> None:
    migrate(engine)
    with engine.begin() as conn:
        conn.execute(
            migrations.schema_migrations.insert().values(
                version=LATEST_VERSION + 1, name="from the future", applied_at=datetime.now(UTC)
            )
        )

    with pytest.raises(MigrationError) as refused:
        Store(db_url)

    assert f"version {LATEST_VERSION + 1}" in refused.value.message
    assert f"up to {LATEST_VERSION}" in refused.value.message
    with engine.connect() as conn:
        assert _versions(conn) == [*(m.version for m in migrations.MIGRATIONS), LATEST_VERSION + 1]


def test_database_with_only_some_hub_tables_is_refused(engine: Engine) -> None:
    _legacy.tables["workloads"].create(engine)

    with pytest.raises(MigrationError, match="not made by gpufed"):
        migrate(engine)


def test_failed_migration_leaves_no_trace(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    migrate(engine)

    def broken(conn: Connection) -> None:
        conn.execute(text("ALTER TABLE spokes ADD COLUMN zone VARCHAR"))
        conn.execute(text("CREATE TABLE half_done (id INTEGER)"))
        raise RuntimeError("boom")

    step = migrations.Migration(LATEST_VERSION + 1, "broken", broken)
    monkeypatch.setattr(migrations, "MIGRATIONS", (*migrations.MIGRATIONS, step))
    monkeypatch.setattr(migrations, "LATEST_VERSION", step.version)

    with pytest.raises(RuntimeError, match="boom"):
        migrate(engine)

    assert current_version(engine) == LATEST_VERSION
    inspector = inspect(engine)
    assert "half_done" not in inspector.get_table_names()
    assert "zone" not in {c["name"] for c in inspector.get_columns("spokes")}


def test_hubs_migrating_at_once_apply_each_version_once(db_url: str) -> None:
    hubs = 4
    barrier = threading.Barrier(hubs)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def start_hub() -> None:
        # An engine each, as separate hub processes would have.
        engine = create_engine(db_url)
        try:
            barrier.wait(timeout=10)
            results.append(migrate(engine))
        except BaseException as exc:
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=start_hub) for _ in range(hubs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert errors == []
    assert sorted(v for applied in results for v in applied) == [
        m.version for m in migrations.MIGRATIONS
    ]
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            assert _versions(conn) == [m.version for m in migrations.MIGRATIONS]
    finally:
        engine.dispose()


def test_migration_versions_are_consecutive_from_one() -> None:
    # A database runs only the steps above its version: a gap filled later would be skipped.
    versions = [m.version for m in migrations.MIGRATIONS]
    assert versions == list(range(1, len(versions) + 1))
    assert versions[-1] == LATEST_VERSION


# --- helpers ---

#: The schema as the pre-migration code's `SQLModel.metadata.create_all` made it.
_legacy = MetaData()
Table(
    "workloads",
    _legacy,
    Column("id", AutoString, primary_key=True),
    Column("team", AutoString, nullable=False, index=True),
    Column("phase", AutoString, nullable=False, index=True),
    Column("submitted_at", Float, nullable=False, index=True),
    Column("data", AutoString, nullable=False),
)
Table(
    "decisions",
    _legacy,
    Column("decision_id", AutoString, primary_key=True),
    Column("workload_id", AutoString, nullable=False, index=True),
    Column("spoke_id", AutoString, nullable=False),
    Column("subject", AutoString, nullable=False),
    Column("payload", LargeBinary, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("published", Boolean, nullable=False, index=True),
)
Table(
    "spokes",
    _legacy,
    Column("id", AutoString, primary_key=True),
    Column("region", AutoString, nullable=False),
    Column("kind", AutoString, nullable=False),
    Column("first_seen", Float, nullable=False),
    Column("last_seen", Float, nullable=False),
    Column("report", AutoString, nullable=True),
)


def _attempt(epoch: int, ended_at: float | None) -> str:
    end = EndReason.FAILED if ended_at is not None else None
    attempt = Attempt(epoch, "s1", (), placed_at=1.0, ended_at=ended_at, end_reason=end)
    return ATTEMPT_ADAPTER.dump_json(attempt).decode()


def _migrate_up_to(version: int, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The schema as this code's first `version` migrations left it (for the later ones)."""
    with monkeypatch.context() as older:
        older.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:version])
        older.setattr(migrations, "LATEST_VERSION", version)
        migrate(engine)


def _versions(conn: Connection) -> list[int]:
    query = select(migrations.schema_migrations.c.version).order_by("version")
    return list(conn.execute(query).scalars())


def _assert_schema_matches_models(engine: Engine) -> None:
    inspector = inspect(engine)
    for table in SQLModel.metadata.sorted_tables:
        if table.name not in (
            "workloads",
            "decisions",
            "spokes",
            "api_tokens",
            "audit_log",
            "attempts",
            "instance_bills",
        ):
            continue
        columns = {c["name"]: c["nullable"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name: c.nullable for c in table.columns}, table.name
        indexes = {i["name"]: tuple(i["column_names"]) for i in inspector.get_indexes(table.name)}
        declared = {i.name: tuple(c.name for c in i.columns) for i in table.indexes}
        assert indexes == declared, table.name
