"""The store's contract, on SQLite and on a real PostgreSQL (tests/integration/databases.py)."""

from __future__ import annotations

import json

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlmodel import SQLModel

import hub.authstore  # noqa: F401  (registers the token and audit tables)
from gpufed.postgres import EmbeddedPostgres
from hub.authstore import AuditEntry
from hub.core import lifecycle
from hub.core.lifecycle import Attempt, EndReason
from hub.records import HistoryEntry, SpokeRecord, WorkloadRecord
from hub.store import Store
from hub.storewrites import NOT_STORED, Kept, Statements, workload_row
from hub.usage import InstanceBill
from schemas import Assignment, CapacityReport, Phase
from schemas.burst import InstanceEvent
from schemas.capacity import NodeCapacity, RunningRef
from tests.integration.databases import decision, workload

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


def test_get_many_reads_those_there_are_past_one_query(store: Store) -> None:
    records = [
        workload(f"w{i}", phase=Phase.SUCCEEDED if i % 2 else Phase.QUEUED) for i in range(1201)
    ]
    records[7].attempts = (Attempt(1, "s1", (), placed_at=100.0, started_at=101.0),)
    store.save(records)
    asked = [f"w{i}" for i in range(1201)] + ["missing"]
    found = {r.id: r for r in store.get_many(asked)}
    assert sorted(found) == sorted(r.id for r in records)  # 1,201 ids: three queries
    assert found["w7"] == records[7] and found["w7"].attempts == records[7].attempts
    assert store.get_many([]) == []


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


def test_ended_workloads_past_their_keep_go_with_their_attempts_longest_ended_first(
    store: Store,
) -> None:
    def ended(wid: str, phase: Phase, finished: float | None) -> WorkloadRecord:
        record = workload(wid, phase=phase, at=10.0, spoke="s1")
        record.finished_at = finished
        return record

    store.save(
        [
            ended("old", Phase.SUCCEEDED, 100.0),
            ended("older", Phase.FAILED, 50.0),
            ended("recent", Phase.CANCELLED, 300.0),
            ended("unstamped", Phase.CANCELLED, None),  # ended without a time: its submission
            workload("running", phase=Phase.RUNNING, at=1.0, spoke="s2"),
            workload("queued", at=1.0),
        ]
    )

    assert store.removed_before() is None
    assert store.remove_finished(before=200.0, limit=2) == 2
    assert {w.id for w in store.find()} == {"old", "recent", "running", "queued"}
    assert store.removed_before() == 200.0
    assert store.remove_finished(before=200.0, limit=2) == 1
    assert store.get("old") is None
    with store.engine.connect() as conn:
        held = conn.execute(text("SELECT workload_id FROM attempts ORDER BY workload_id"))
        assert [row[0] for row in held] == ["recent", "running"]
    # However late the cut, a live workload never goes.
    assert store.remove_finished(before=1e12, limit=100) == 1
    assert {w.id for w in store.find()} == {"running", "queued"}
    assert store.remove_finished(before=2e12, limit=100) == 0  # nothing went: no later bound
    assert store.removed_before() == 1e12
    assert store.remove_finished(before=100.0, limit=100) == 0
    assert store.removed_before() == 1e12
    assert store.active()[0].attempts == workload("running", at=1.0, spoke="s2").attempts


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
    assert [w.id for w in store.find(since=3.0)] == ["v4", "v3", "v2"]  # at or after


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


def test_published_decisions_leave_the_store(store: Store) -> None:
    # An outbox: a hub that placed a million workloads keeps no million commands.
    store.save([workload("w1")], [decision(f"d{i}", at=float(i)) for i in range(50)])
    store.mark_published_later(f"d{i}" for i in range(49))
    store.save([workload("w2")])

    assert [d.decision_id for d in store.unpublished()] == ["d49"]
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM decisions")).scalar_one() == 1


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


def _preempted(record: WorkloadRecord, times: int, at: float) -> None:
    """Place `record` and have it preempted `times` times (each a free requeue)."""
    rules = record.retry_rules
    for i in range(times):
        record.lifecycle = lifecycle.place(record.lifecycle, f"s{i % 3}", (), at + i)
        record.lifecycle = lifecycle.end(
            record.lifecycle, record.epoch, EndReason.PREEMPTED, at + i + 0.5, rules
        )


def test_a_workload_preempted_many_times_keeps_every_attempt_as_it_changes(
    db_url: str,
) -> None:
    store = Store(db_url)
    record = workload("w1")
    _preempted(record, 30, 100.0)
    store.save([record])
    record.lifecycle = lifecycle.place(record.lifecycle, "s1", (), 200.0)
    store.save([record])
    record.lifecycle = lifecycle.start(record.lifecycle, record.epoch, 201.0)
    store.save([record])
    store.save([record])  # nothing changed
    record.lifecycle = lifecycle.end(
        record.lifecycle, record.epoch, EndReason.SUCCEEDED, 250.0, record.retry_rules, 0
    )
    store.save([record])
    store.close()

    stored = _read_back(db_url, "w1")
    assert len(stored.attempts) == 31
    assert stored.attempts == record.attempts
    assert stored.phase == Phase.SUCCEEDED


def _read_back(db_url: str, workload_id: str) -> WorkloadRecord:
    """The workload as a new store reads it: one that knows nothing of what the first one
    wrote or kept."""
    reopened = Store(db_url)
    try:
        stored = reopened.get(workload_id)
    finally:
        reopened.close()
    assert stored is not None
    return stored


def test_attempts_a_failed_save_missed_go_with_the_next_save(store: Store) -> None:
    record = workload("w1")
    record.lifecycle = lifecycle.place(record.lifecycle, "s1", (), 100.0)
    store.save([record])
    # Preempted and placed again, then saved in a transaction that fails.
    record.lifecycle = lifecycle.end(
        record.lifecycle, 1, EndReason.PREEMPTED, 110.0, record.retry_rules
    )
    record.lifecycle = lifecycle.place(record.lifecycle, "s2", (), 120.0)
    broken = AuditEntry(at=1.0, actor="a", role="admin", action="submit", result="ok")
    object.__setattr__(broken, "actor", None)
    dropped = workload("w2")  # new in that save, and dropped with it (as a failed cycle does)
    with pytest.raises(DBAPIError):
        store.save([record, dropped], audits=[broken])
    stored = store.get("w1")
    assert stored is not None and stored.attempts[0].ended_at is None  # rolled back
    assert "w2" not in store._kept  # never saved again: nothing of it stays in memory

    store.save([record])

    stored = store.get("w1")
    assert stored is not None
    assert stored.attempts == record.attempts
    assert [a.spoke_id for a in stored.attempts] == ["s1", "s2"]


def test_a_history_saved_many_times_keeps_every_entry_through_a_cut(db_url: str) -> None:
    # Each save serialises only the entries added since the last (`Kept`); a cycle whose save
    # failed cuts the history back (hub.cycle's undo), and what follows must not keep the cut.
    store = Store(db_url)
    record = workload("w1")
    for i in range(5):
        record.note(100.0 + i, f"step-{i}")
        store.save([record])
    noted = len(record.history)
    record.note(110.0, "placed", "on s1")  # a cycle's note, its save failed: cut back
    store.save([record])
    del record.history[noted:]
    record.note(111.0, "placed", "on s2")
    store.save([record])
    stored = store.get("w1")
    assert stored is not None and stored.history[-1].detail == "on s2"
    del record.history[2:]  # cut back further, nothing added
    store.save([record])
    stored = store.get("w1")
    assert stored is not None and stored.history == record.history
    record.note(120.0, "running")
    record.lifecycle = lifecycle.place(record.lifecycle, "s2", (), 120.0)
    record.lifecycle = lifecycle.end(
        record.lifecycle, record.epoch, EndReason.SUCCEEDED, 130.0, record.retry_rules, 0
    )
    record.note(130.0, "succeeded")
    store.save([record])
    store.close()

    stored = _read_back(db_url, "w1")
    assert [h.event for h in stored.history] == ["step-0", "step-1", "running", "succeeded"]
    assert stored == record


def test_a_workload_row_holds_what_its_record_serialises_to(store: Store) -> None:
    # Pieces serialised once and joined must read as the record serialised whole.
    record = workload("w1", spoke="s1", phase=Phase.RUNNING)
    kept = Kept()
    for i in range(3):
        record.note(100.0 + i, "placed", f'on "s{i}"\n')
        row = workload_row(record, kept)
        assert json.loads(row[-1]) == json.loads(record.model_dump_json(exclude=set(NOT_STORED)))
    record.spec = record.spec.model_copy(update={"name": "renamed"})
    row = workload_row(record, kept)
    assert json.loads(row[-1])["spec"]["name"] == "renamed"


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
    store.save_spokes([with_report, bare])
    store.save_spokes([with_report.model_copy(update={"last_seen": 9.0})])

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
