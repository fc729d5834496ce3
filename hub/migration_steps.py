"""Schema migrations 5 and later (attempts, instance bills, tokens, audit, usage, outbox,
retention).

Split from `hub.migrations`, which lists every step in `MIGRATIONS` and applies them; these
steps are frozen once released, as the earlier ones are (docs/store.md).
"""

from __future__ import annotations

import json
from typing import Any

import structlog
from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    delete,
    func,
    select,
    text,
    update,
)

log = structlog.get_logger(__name__)

#: Rows read and rewritten per statement when a migration backfills a column.
BACKFILL_BATCH = 500


def v5_attempts(conn: Connection) -> None:
    """attempts: every placement of every workload, backfilled from the workloads' JSON."""
    metadata = MetaData()
    attempts = Table(
        "attempts",
        metadata,
        Column("workload_id", String, primary_key=True),
        Column("epoch", Integer, primary_key=True, autoincrement=False),
        Column("spoke_id", String, nullable=False),
        Column("placed_at", Float, nullable=False),
        Column("ended_at", Float, nullable=True),
        Column("end_reason", String, nullable=True),
        Column("data", String, nullable=False),
    )
    attempts.create(conn)
    Index("ix_attempts_spoke_id", attempts.c.spoke_id).create(conn)
    workloads = Table("workloads", metadata, Column("id", String), Column("data", String))
    last_id = ""
    filled = 0
    while True:
        rows = conn.execute(
            select(workloads.c.id, workloads.c.data)
            .where(workloads.c.id > last_id)
            .order_by(workloads.c.id)
            .limit(BACKFILL_BATCH)
        ).all()
        if not rows:
            break
        batch = [
            {"workload_id": row_id, **attempt}
            for row_id, data in rows
            for attempt in _attempts_in(data)
        ]
        if batch:
            conn.execute(attempts.insert(), batch)
            filled += len(batch)
        last_id = rows[-1][0]
    log.info("schema_backfilled", table="attempts", rows=filled)


#: History events that ended an attempt (the free strings of the code before attempts).
_ENDS = frozenset(
    {"succeeded", "failed", "cancelled", "preempted", "rejected", "spoke_lost", "lost_on_spoke"}
)


def _attempts_in(data: str) -> list[dict[str, Any]]:
    """The attempts a workload record written before v5 went through, from its history.

    Every `placed` entry opened one (its epoch and spoke), `running` started it, an end event
    of the same epoch ended it. The current attempt's devices and command sequence come from the
    record; earlier ones kept no devices. A fence epoch past every placement (a workload
    requeued after its spoke was lost) becomes an ended attempt, so epochs keep growing.
    """
    try:
        record: Any = json.loads(data)
    except ValueError:
        return []
    if not isinstance(record, dict):
        return []
    found: dict[int, dict[str, Any]] = {}
    for entry in record.get("history") or ():
        epoch, event, at = entry.get("epoch", 0), entry.get("event"), entry.get("at", 0.0)
        if event == "placed" and entry.get("spoke_id"):
            found[epoch] = _attempt(epoch, entry["spoke_id"], at)
        elif epoch in found and event == "running":
            found[epoch]["started_at"] = at
        elif epoch in found and event in _ENDS and found[epoch]["ended_at"] is None:
            found[epoch].update(ended_at=at, end_reason=event)
    epoch = record.get("epoch", 0)
    live = record.get("phase") in ("placed", "running")
    if epoch > max(found, default=0):
        placed_at = record.get("placed_at") or record.get("submitted_at") or 0.0
        found[epoch] = _attempt(epoch, record.get("spoke_id") or "", placed_at)
        if not live:
            found[epoch].update(
                ended_at=record.get("finished_at") or placed_at, end_reason=_end_of(record)
            )
    current = found.get(epoch)
    if current is not None and live:
        current["started_at"] = record.get("started_at")
        current["ended_at"] = current["end_reason"] = None
    if current is not None and current["spoke_id"] == record.get("spoke_id"):
        current["assignments"] = record.get("assignments") or []
        current["exit_code"] = record.get("exit_code")
        current["preempting"] = bool(record.get("preempting"))
        current["preempted_for"] = record.get("preempted_for")
        current["command_seq"] = record.get("command_seq")
    return [
        {
            "epoch": a["epoch"],
            "spoke_id": a["spoke_id"],
            "placed_at": a["placed_at"],
            "ended_at": a["ended_at"],
            "end_reason": a["end_reason"],
            "data": json.dumps(a),
        }
        for _, a in sorted(found.items())
    ]


def _end_of(record: dict[str, Any]) -> str:
    # Queued with an epoch past its placements: requeued after its spoke was lost.
    phase, reason = record.get("phase"), record.get("reason")
    if phase in ("failed", "cancelled") and reason in _ENDS:
        return str(reason)
    return {"succeeded": "succeeded", "failed": "failed", "cancelled": "cancelled"}.get(
        str(phase), "spoke_lost"
    )


def _attempt(epoch: int, spoke_id: str, placed_at: float) -> dict[str, Any]:
    # hub.core.lifecycle.Attempt as JSON, spelled out: this migration must not change with it.
    return {
        "epoch": epoch,
        "spoke_id": spoke_id,
        "assignments": [],
        "placed_at": placed_at,
        "started_at": None,
        "ended_at": None,
        "end_reason": None,
        "exit_code": None,
        "preempting": False,
        "preempted_for": None,
        "command_seq": None,
    }


def v6_instance_bills(conn: Connection) -> None:
    """instance_bills: what each burst instance costs (requested, running, ended), per team."""
    metadata = MetaData()
    table = Table(
        "instance_bills",
        metadata,
        Column("burst_id", String, primary_key=True),
        Column("team", String, nullable=False),
        Column("requested_at", Float, nullable=False),
        Column("ended_at", Float, nullable=True),
        Column("data", String, nullable=False),
    )
    table.create(conn)
    Index("ix_instance_bills_requested_at", table.c.requested_at).create(conn)
    # Instances recorded before bills existed: open a bill from their latest event (the time
    # before it is unknown, so it is not billed).
    old = Table("burst_instances", MetaData(), autoload_with=conn)
    for row in conn.execute(select(old.c.data)).all():
        event = json.loads(row.data)
        ended = event["at"] if event["state"] in ("terminated", "failed") else None
        bill = {
            "burst_id": event["burst_id"],
            "team": event["team"],
            "spoke_id": event.get("spoke_id") or event["burst_id"],
            "provider": event["provider"],
            "instance_type": event["instance_type"],
            "price_per_hour": event["price_per_hour"],
            "requested_at": event["at"],
            "running_at": event["at"] if event["state"] != "requested" else None,
            "ended_at": ended,
        }
        conn.execute(
            table.insert().values(
                burst_id=bill["burst_id"],
                team=bill["team"],
                requested_at=bill["requested_at"],
                ended_at=ended,
                data=json.dumps(bill),
            )
        )


def v7_tokens_audit_spend(conn: Connection) -> None:
    """api_tokens (hashed), audit_log (append-only), burst_spend and burst_accrual."""
    metadata = MetaData()
    tokens = Table(
        "api_tokens",
        metadata,
        Column("id", String, primary_key=True),
        Column("user_name", String, nullable=False),
        Column("team", String, nullable=True),
        Column("role", String, nullable=False),
        Column("secret_hash", String, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("created_by", String, nullable=False),
        Column("expires_at", Float, nullable=True),
        Column("revoked_at", Float, nullable=True),
    )
    audit = Table(
        "audit_log",
        metadata,
        Column("seq", Integer, primary_key=True, autoincrement=True),
        Column("at", Float, nullable=False),
        Column("actor", String, nullable=False),
        Column("role", String, nullable=False),
        Column("action", String, nullable=False),
        Column("team", String, nullable=True),
        Column("target", String, nullable=False),
        Column("result", String, nullable=False),
        Column("detail", String, nullable=False),
    )
    spend = Table(
        "burst_spend",
        metadata,
        Column("team", String, primary_key=True),
        Column("month", String, primary_key=True),
        Column("dollars", Float, nullable=False),
    )
    accrual = Table(
        "burst_accrual",
        metadata,
        Column("burst_id", String, primary_key=True),
        Column("accrued_until", Float, nullable=False),
    )
    for table in (tokens, audit, spend, accrual):
        table.create(conn)
    Index("ix_audit_log_team", audit.c.team).create(conn)
    Index("ix_audit_log_at", audit.c.at).create(conn)


def v8_usage_windows(conn: Connection) -> None:
    """Drop burst_spend and burst_accrual (spend is read from the instance bills); index the
    end times of attempts and bills, which usage windows filter on.

    A second meter beside the bills counted the same dollars in its own way and drifted from
    them; everything it held can be recomputed from `instance_bills`.
    """
    metadata = MetaData()
    for name in ("burst_spend", "burst_accrual"):
        Table(name, metadata).drop(conn, checkfirst=True)
    for table in ("attempts", "instance_bills"):
        ended = Table(table, metadata, Column("ended_at", Float)).c.ended_at
        Index(f"ix_{table}_ended_at", ended).create(conn)


def v9_decisions_outbox(conn: Connection) -> None:
    """`decisions` is an outbox: a decision leaves it once JetStream has acked it, so drop the
    published rows kept until now (each held its whole command, the spec with it: the table
    grew by one row per placement, forever) and the index on `workload_id`, which nothing
    reads."""
    metadata = MetaData()
    decisions = Table(
        "decisions",
        metadata,
        Column("workload_id", String),
        Column("published", Boolean),
    )
    dropped = conn.execute(delete(decisions).where(decisions.c.published.is_(True))).rowcount
    Index("ix_decisions_workload_id", decisions.c.workload_id).drop(conn, checkfirst=True)
    log.info("schema_outbox_emptied", table="decisions", rows=dropped)


#: Phases a workload never leaves (`schemas.Phase.terminal`, as they were written at v10).
_TERMINAL_AT_V10 = ("succeeded", "failed", "cancelled")


def v10_finished_at(conn: Connection) -> None:
    """workloads.finished_at (indexed where set): when an ended workload ended, NULL while it
    lives, so ended workloads past their keep (`hub.retention`) are found without reading
    every row. Backfilled for the ended ones in two statements on both backends (a JSON read
    per row took seven minutes for 434,000 workloads; this takes seconds)."""
    finished_at = Table("workloads", MetaData(), Column("finished_at", Float)).c.finished_at
    conn.execute(text("ALTER TABLE workloads ADD COLUMN finished_at FLOAT"))
    # Partial: a live workload's NULL is not indexed, so a save of one costs no index entry.
    ended = finished_at.isnot(None)
    Index(
        "ix_workloads_finished_at", finished_at, sqlite_where=ended, postgresql_where=ended
    ).create(conn)
    filled = backfill_finished_at(conn)
    log.info("schema_backfilled", table="workloads", column="finished_at", rows=filled)


def v11_audit_via(conn: Connection) -> None:
    """audit_log.via: how the caller of each entry was authenticated (`token:<id>`,
    `oidc:<issuer>`, `admin-token`, `nats`), so what one token did can be found (a leaked one,
    say); '' for the entries written before."""
    conn.execute(text("ALTER TABLE audit_log ADD COLUMN via VARCHAR NOT NULL DEFAULT ''"))


def backfill_finished_at(conn: Connection) -> int:
    """Set `finished_at` of every ended workload: the end of its last attempt, or its
    submission when it never ran; return how many rows it set (bench/store_retention.py).

    The ends are read in one grouped pass over the attempts and joined (`UPDATE ... FROM`):
    a subquery per row ran for over ten minutes on PostgreSQL for 100,000 workloads."""
    metadata = MetaData()
    workloads = Table(
        "workloads",
        metadata,
        Column("id", String, primary_key=True),
        Column("phase", String),
        Column("submitted_at", Float),
        Column("finished_at", Float, nullable=True),
    )
    attempts = Table("attempts", metadata, Column("workload_id", String), Column("ended_at", Float))
    ended = workloads.c.phase.in_(_TERMINAL_AT_V10)
    last = (
        select(attempts.c.workload_id, func.max(attempts.c.ended_at).label("ended_at"))
        .group_by(attempts.c.workload_id)
        .subquery()
    )
    conn.execute(
        update(workloads)
        .where(workloads.c.id == last.c.workload_id, ended)
        .values(finished_at=last.c.ended_at)
    )
    conn.execute(  # never ran (or no attempt says when it ended): its submission
        update(workloads)
        .where(ended, workloads.c.finished_at.is_(None))
        .values(finished_at=workloads.c.submitted_at)
    )
    count = select(func.count()).select_from(workloads).where(ended)
    return int(conn.execute(count).scalar_one())
