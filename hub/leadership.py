"""Which of several hub replicas leads: a PostgreSQL advisory lock held by one session.

Exactly one replica holds the lock; it leads and the others stand by (they answer reads and
refuse writes). The lock lives as long as the leader's database session: a leader that dies,
however it dies, closes its connection and PostgreSQL releases the lock at once. A standby
does not poll for it: its session waits *in* PostgreSQL (`pg_advisory_lock`, bounded by
`lock_timeout` = `poll_s` so it can notice a stop), and PostgreSQL grants the lock to the
waiting session the moment the holder's session ends, so a takeover starts within
milliseconds of the leader's death, on a loaded machine too. A leader that merely loses its
connection (a partition) loses the lock with it: it notices within `poll_s`, stops acting and
exits, and the replica that takes over has a newer term.

Each leader bumps the stored `leader_term` as soon as it holds the lock; every command, lease
ack and demand report carries that term, and spokes and burst ignore older ones, so nothing a
deposed leader sends late takes effect.

On SQLite there is one hub and no lock: it leads at once (its term still increases on every
start).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

import anyio.to_thread
import structlog
from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from bus.tasks import pause

log = structlog.get_logger(__name__)

#: The advisory lock's key: "gpufed" spelled as a number, one lock per database.
LOCK_KEY = 0x677075666564
TERM_KEY = "leader_term"
HOLDER_KEY = "leader"
#: Store key of the leading replica's API URL (what a standby names to its callers).
LEADER_URL_KEY = "leader_url"
#: SQLSTATE of a lock wait that ran past `lock_timeout`.
LOCK_NOT_AVAILABLE = "55P03"


class Leadership:
    """Acquire, keep and watch the hub's leadership (see the module docstring)."""

    def __init__(self, store_url: str, holder: str = "", poll_s: float = 1.0) -> None:
        url = make_url(store_url)
        if url.drivername == "postgresql":
            url = url.set(drivername="postgresql+psycopg")
        self.url = url
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.poll_s = poll_s
        self.term = 0
        self.lost = asyncio.Event()
        self._conn: Connection | None = None
        self._postgres = url.get_backend_name() == "postgresql"

    @property
    def shared(self) -> bool:
        """Whether several replicas can share this store (PostgreSQL)."""
        return self._postgres

    async def acquire(self, stop: asyncio.Event, bump_term: object) -> int:
        """Wait until this replica leads (or `stop`); returns its new term.

        `bump_term` is an async callable () -> int that stores term + 1 and returns it; it runs
        only while the lock is held.
        """
        if self._postgres:
            waited = False
            while not stop.is_set():
                try:
                    if await anyio.to_thread.run_sync(self._try_lock):
                        break
                except SQLAlchemyError as exc:
                    log.warning("leader_lock_failed", error=str(exc).splitlines()[0])
                    self._close()
                if not waited:
                    log.info("hub_standby", holder=self.holder)
                    waited = True
                if self._conn is None:  # the store is unreachable: wait before trying again
                    await pause(stop, self.poll_s)
            if stop.is_set():
                return 0
        self.term = await bump_term()  # type: ignore[operator]
        log.info("hub_leading", term=self.term, holder=self.holder)
        return self.term

    async def watch(self, stop: asyncio.Event) -> None:
        """While leading: check every `poll_s` that the lock's session lives; set `lost` if not."""
        if not self._postgres:
            await stop.wait()
            return
        while not stop.is_set():
            try:
                await anyio.to_thread.run_sync(self._ping)
            except SQLAlchemyError as exc:
                log.error("leadership_lost", term=self.term, error=str(exc).splitlines()[0])
                self._close()
                self.lost.set()
                return
            await pause(stop, self.poll_s)

    def close(self) -> None:
        """Give the lock up (a clean stop): a standby takes over at its next poll."""
        self._close()

    # --- in a worker thread ---

    def _try_lock(self) -> bool:
        """Wait in PostgreSQL up to `poll_s` for the lock; True once this session holds it."""
        if self._conn is None:
            engine = create_engine(self.url, pool_size=1, max_overflow=0)
            self._conn = engine.connect()
            # Autocommit: the lock belongs to the session, never to a transaction.
            self._conn = self._conn.execution_options(isolation_level="AUTOCOMMIT")
            wait_ms = max(1, int(self.poll_s * 1000))
            self._conn.execute(text(f"SET lock_timeout = {wait_ms}"))
        try:
            self._conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": LOCK_KEY})
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == LOCK_NOT_AVAILABLE:
                return False  # still held by the leader: wait again
            raise
        return True

    def _ping(self) -> None:
        if self._conn is None:
            raise SQLAlchemyError("no leader session")
        self._conn.execute(text("SELECT 1"))

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
            with contextlib.suppress(Exception):
                conn.engine.dispose()
