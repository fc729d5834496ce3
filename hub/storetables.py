"""The store's tables: sqlmodel rows of the latest schema, which `hub.store.Store` reads and
writes and `hub.migrations` creates and upgrades (docs/store.md). Change both together.

Records are kept whole as JSON (`data`) beside the few columns they are queried by.
"""

from __future__ import annotations

from sqlalchemy import Index, LargeBinary, text
from sqlmodel import Column, Field, SQLModel

#: Only ended workloads have a `finished_at`: a live one's NULL is left out of its index.
_ENDED = text("finished_at IS NOT NULL")


class WorkloadRow(SQLModel, table=True):
    __tablename__ = "workloads"
    __table_args__ = (
        Index(
            "ix_workloads_finished_at", "finished_at", sqlite_where=_ENDED, postgresql_where=_ENDED
        ),
    )
    id: str = Field(primary_key=True)
    team: str = Field(index=True)
    phase: str = Field(index=True)
    submitted_at: float = Field(index=True)
    spoke_id: str | None = Field(default=None, index=True)
    # When it ended (NULL while it lives): ended workloads leave after their keep (migration 10)
    finished_at: float | None = None
    data: str


class AttemptRow(SQLModel, table=True):
    __tablename__ = "attempts"
    workload_id: str = Field(primary_key=True)
    epoch: int = Field(primary_key=True)
    spoke_id: str = Field(index=True)
    placed_at: float
    ended_at: float | None = Field(default=None, index=True)  # usage windows (migration 8)
    end_reason: str | None = None
    data: str


class DecisionRow(SQLModel, table=True):
    __tablename__ = "decisions"
    __table_args__ = (Index("ix_decisions_published_created_at", "published", "created_at"),)
    decision_id: str = Field(primary_key=True)
    workload_id: str
    spoke_id: str
    subject: str
    payload: bytes = Field(sa_column=Column(LargeBinary, nullable=False))
    created_at: float
    published: bool = Field(default=False)


class SpokeRow(SQLModel, table=True):
    __tablename__ = "spokes"
    id: str = Field(primary_key=True)
    region: str
    kind: str
    first_seen: float
    last_seen: float
    report: str | None = None


class BurstInstanceRow(SQLModel, table=True):
    __tablename__ = "burst_instances"
    burst_id: str = Field(primary_key=True)
    team: str = Field(index=True)
    state: str
    updated_at: float
    data: str


class InstanceBillRow(SQLModel, table=True):
    __tablename__ = "instance_bills"
    burst_id: str = Field(primary_key=True)
    team: str
    requested_at: float = Field(index=True)
    ended_at: float | None = Field(default=None, index=True)  # usage windows (migration 8)
    data: str


class SettingRow(SQLModel, table=True):
    __tablename__ = "hub_settings"
    key: str = Field(primary_key=True)
    value: str
    updated_at: float
