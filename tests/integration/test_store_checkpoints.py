"""The hub checkpoints its SQLite store's log by itself, beside the writer (`hub.engine`): what
it saved reaches the database file within about a second, and no commit of a cycle has to
run a checkpoint (and wait for the disk) until the log is far past SQLite's own threshold."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import structlog
from sqlalchemy import event

from hub import checkpoints as checkpoints_module
from hub.checkpoints import checkpoints
from hub.core.policy import Policy
from hub.engine import AUTO_CHECKPOINT_PAGES
from hub.settings import HubSettings
from hub.state import HubState
from hub.store import Store
from hub.storewrites import transaction
from schemas import Phase
from tests.integration.databases import workload
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


def test_a_checkpoint_copies_the_log_into_the_file_and_commits_leave_it_alone(
    db_url: str,
) -> None:
    store = Store(db_url)
    try:
        store.save([workload("w1")])
        done = store.checkpoint()
        if not db_url.startswith("sqlite"):
            assert done is None  # PostgreSQL: no log of ours to copy
            return
        assert done is not None
        pages, copied = done
        assert pages > 0 and copied == pages  # nobody reading: the whole log copied
        with store.engine.connect() as conn:
            threshold = conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar()
        assert threshold == AUTO_CHECKPOINT_PAGES
    finally:
        store.close()


def _bytes_read() -> int:
    """What this process has read through system calls so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_a_checkpoint_beside_a_save_leaves_the_writer_reading_nothing_again(
    tmp_path: Path,
) -> None:
    # A commit on another connection empties a SQLite connection's page cache. A checkpoint
    # that ran while a save held the writer's connection opened a second one in the writer's
    # pool, which then handed out the two in turn: every save read all the pages it touched
    # from the file again (27 KB a workload at 400 submissions a second).
    store = Store.sqlite(tmp_path / "hub.db")
    try:
        records = [workload(f"w{i:04}") for i in range(300)]
        store.save(records)
        with transaction(store.engine):  # a save under way: the hub's checkpoint comes
            assert store.checkpoint() is not None
        store.save(records[:1])
        before = _bytes_read()
        for record in records[:20]:
            record.message = "saved again"
            store.save([record])
        assert _bytes_read() - before < 4096  # not one page read back for twenty saves
    finally:
        store.close()


def _holds(db_file: Path, copy: Path, workload_id: str) -> bool:
    """Whether the database file alone (without its log) holds the workload: read from a copy
    of the file, as a backup of the file would be."""
    shutil.copyfile(db_file, copy)
    conn = sqlite3.connect(copy)
    try:
        row = conn.execute("SELECT phase FROM workloads WHERE id = ?", (workload_id,))
        return row.fetchone() is not None
    except sqlite3.DatabaseError:  # copied while a checkpoint wrote it: look again
        return False
    finally:
        conn.close()


async def test_what_the_hub_saved_reaches_its_database_file_within_seconds(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    hub = await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(name="kept", team="vision", command=["sleep", "30"])
    await fed.wait_phase(wid, {Phase.RUNNING})
    db_file = Path(hub.store.url.removeprefix("sqlite:///"))
    # A few pages of log: far below the threshold at which a commit would checkpoint.
    await wait_until(
        lambda: _holds(db_file, tmp_path / "copy.db", wid),
        10,
        "the workload in the database file, not only in the log",
    )


async def test_checkpoints_that_fail_are_logged_once_and_go_on_once_they_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store.sqlite(tmp_path / "hub.db")
    state = HubState(HubSettings(), store, lambda: 100.0, Policy())
    refused = 0

    def refuse(*_: Any) -> None:  # the first connections the pool hands out are unusable
        nonlocal refused
        if refused < 3:
            refused += 1
            raise sqlite3.OperationalError("disk I/O error")

    event.listen(store.checkpoint_engine, "checkout", refuse)
    monkeypatch.setattr(checkpoints_module, "CHECKPOINT_EVERY_S", 0.01)
    stop = asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(checkpoints(state, stop))
        await wait_until(lambda: refused == 3, 10, "three checkpoints refused")
        await asyncio.to_thread(store.save, [workload("after")])
        await wait_until(
            lambda: _holds(tmp_path / "hub.db", tmp_path / "copy.db", "after"),
            10,
            "the save in the database file once checkpoints work again",
        )
        stop.set()
        await asyncio.wait_for(task, 10)
    store.close()
    failed = [e for e in logs if e["event"] == "store_checkpoint_failed"]
    assert len(failed) == 1  # three rounds failed, one line said so
    assert "disk I/O error" in failed[0]["error"]
