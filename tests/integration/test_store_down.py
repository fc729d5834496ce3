"""Which failures of a store call are the store's own (`hub.engine.down`): those the hub says
as `store_unavailable` (retryable), not as a request gone wrong or the hub failing."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from bus.ports import free_port
from hub.engine import down, engine_for


def test_a_store_that_cannot_be_reached_or_opened_is_down(tmp_path: Path) -> None:
    # No PostgreSQL server on that port (the connection is refused), and a SQLite file in a
    # folder that is not there.
    urls = [
        f"postgresql://gpufed:secret@127.0.0.1:{free_port()}/gpufed?connect_timeout=5",
        f"sqlite:///{tmp_path / 'gone' / 'hub.db'}",
    ]
    for url in urls:
        engine = engine_for(url)
        try:
            with pytest.raises(OperationalError) as failed:
                engine.connect().close()
            assert down(engine, failed.value), url
            driver_error = failed.value.orig  # the driver's own, as a pool's checkout hands on
            assert driver_error is not None and down(engine, driver_error), url
        finally:
            engine.dispose()


def test_a_call_that_was_wrong_is_not_the_store_down(tmp_path: Path) -> None:
    engine = engine_for(f"sqlite:///{tmp_path / 'hub.db'}")
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
            with pytest.raises(IntegrityError) as twice:
                conn.execute(text("INSERT INTO t VALUES (1)"))
        assert not down(engine, twice.value)
        assert not down(engine, ValueError("not the store's"))
    finally:
        engine.dispose()
