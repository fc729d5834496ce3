"""The store's database engine, and SQLite's checkpoints kept off the writer's path.

Under WAL a commit appends to the write-ahead log; a checkpoint copies the log's pages into
the database file and syncs both. SQLite runs one inside whichever commit finds the log past
`wal_autocheckpoint` pages (1,000 by default): at 400 submissions a second that was one cycle's
commit in 25, and it waited for the disk: 5-7 ms on a quiet disk here, 288 ms while another
process wrote 4 GB (a scratch loop of commits like a cycle's, with and without). The hub's
cycle waits for its commit (the outbox: nothing goes out unsaved), so every cycle so picked
waited too. The hub now checkpoints every `CHECKPOINT_EVERY_S` on a thread of its own
(`checkpoint`, PASSIVE: the writer is never blocked, and goes on appending meanwhile), and a
commit runs one itself only past `AUTO_CHECKPOINT_PAGES`: a backstop for a log that nobody
checkpoints (another process writing, a hub whose checkpoints fail). The checkpoints have a
connection of their own, and the writer keeps one (`engine_for`): a commit on another
connection empties a connection's page cache.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import StaticPool
from sqlmodel import create_engine

#: A commit checkpoints the log itself only past this many pages (40 MB of 4 KB pages: at
#: 400 submissions a second the log grows by about 2,000 a second).
AUTO_CHECKPOINT_PAGES = 10_000
#: How often the hub checkpoints the log (s).
CHECKPOINT_EVERY_S = 1.0


def engine_for(url: str, *, one_connection: bool = False) -> Engine:
    """The engine for a store URL: psycopg 3 for PostgreSQL; SQLite under WAL.

    SQLite's pool hands out the connection returned last: a connection's page cache is
    dropped whenever another connection committed since its last transaction, and the pool's
    default (the one idle longest) made the writer take turns with the connection a
    checkpoint had opened beside it, reading every page it touched from the file again on
    every commit. `one_connection`: an engine of a single connection of its own (the
    checkpoints').
    """
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        # SQLAlchemy's default PostgreSQL driver is psycopg2; ours is psycopg 3.
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() == "sqlite":
        pool: dict[str, Any] = (
            {"poolclass": StaticPool} if one_connection else {"pool_use_lifo": True}
        )
        engine = create_engine(
            parsed, connect_args={"check_same_thread": False, "timeout": 30}, **pool
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # pre_ping: a pooled connection dropped by a database restart is replaced, not reused.
    return create_engine(parsed, pool_pre_ping=True)


def down(engine: Engine, exc: BaseException) -> bool:
    """Whether `exc`, raised by a call on `engine`, says the database cannot answer now (a disk
    I/O error, a full disk, a PostgreSQL server down, restarting or failing over, no pooled
    connection to spare), not that the call was wrong: SQLAlchemy's kinds of it, and the
    driver's own where SQLAlchemy hands them on unwrapped (raised in a pool's checkout)."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout):
        return True
    dbapi = engine.dialect.loaded_dbapi
    return isinstance(exc, dbapi.OperationalError | dbapi.InterfaceError)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # WAL lets readers (the API) run beside the writer; NORMAL sync is crash-safe under WAL.
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA wal_autocheckpoint={AUTO_CHECKPOINT_PAGES}")
    cursor.close()


def checkpoint(engine: Engine) -> tuple[int, int] | None:
    """Copy what the SQLite log holds into the database file, beside the writer (PASSIVE), on
    `engine`: one that is not the writer's (`engine_for(..., one_connection=True)`), so the
    writer's connection keeps its pages. Returns the log's pages and those now copied; None
    for another database, which needs no such thing."""
    if engine.dialect.name != "sqlite":
        return None
    connection = engine.raw_connection()
    try:
        cursor = connection.cursor()
        try:
            _busy, pages, copied = cursor.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            cursor.close()
    finally:
        connection.close()  # back to the pool
    return int(pages), int(copied)
