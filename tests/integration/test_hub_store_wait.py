"""A hub started before its PostgreSQL server (a cluster starts them in any order) waits for it,
each try logged with the URL's password masked, and serves once the database is up; SIGTERM
while it waits stops it at once. A SQLite store that cannot be opened is said in one line."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from bus.natsserver import EmbeddedNats
from bus.ports import free_port
from gpufed.postgres import EmbeddedPostgres
from tests.integration.databases import server_root

pytestmark = pytest.mark.integration


class Hub:
    """`gpufed hub` as a process, its log lines read as they come."""

    def __init__(self, *argv: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpufed", "hub", *argv],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def line_with(self, word: str, timeout_s: float = 60) -> str:
        """The first line from now on that holds `word` (the guard: it logs within seconds)."""
        deadline = time.monotonic() + timeout_s
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if word in line:
                return line

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:  # only if the test failed
            self.proc.kill()
            self.proc.wait()


def test_a_hub_waits_for_its_postgresql_and_serves_once_it_is_up(tmp_path: Path) -> None:
    with server_root(tmp_path) as root:
        waits_for(EmbeddedPostgres(root).start(), tmp_path)  # made, then stopped: not up yet


def waits_for(postgres: EmbeddedPostgres, tmp_path: Path) -> None:
    url = postgres.url("postgres")
    postgres.stop()
    password = url.split(":")[2].split("@")[0]
    url_file = tmp_path / "store-url"
    url_file.write_text(url)
    api = free_port()
    with EmbeddedNats(tmp_path / "nats") as nats:
        hub = Hub(
            *("--nats-url", nats.url, "--data-dir", str(tmp_path / "hub")),
            *("--api-port", str(api), "--store-url-file", str(url_file)),
        )
        try:
            waiting = hub.line_with("store_unreachable")
            assert "postgres:***@127.0.0.1" in waiting and password not in waiting
            postgres.start()
            hub.line_with("hub_ready")
            assert httpx.get(f"http://127.0.0.1:{api}/v1/health", timeout=5).status_code == 200
            assert hub.stop() == 0
        finally:
            hub.kill()
            postgres.stop()


def test_sigterm_stops_a_hub_waiting_for_its_database(tmp_path: Path) -> None:
    url_file = tmp_path / "store-url"
    url_file.write_text(f"postgresql+psycopg://gpufed:secret@127.0.0.1:{free_port()}/gpufed")
    hub = Hub(
        *("--nats-url", "nats://127.0.0.1:1", "--data-dir", str(tmp_path / "hub")),
        *("--api-port", str(free_port()), "--store-url-file", str(url_file)),
    )
    try:
        hub.line_with("store_unreachable")
        assert hub.stop() == 0
    finally:
        hub.kill()


def test_a_sqlite_store_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "hub.db").mkdir()  # a folder where the database file should be
    argv = ["hub", "--nats-url", "nats://127.0.0.1:1", "--data-dir", str(tmp_path / "hub")]
    argv += ["--api-port", str(free_port()), "--store-url", f"sqlite:///{store / 'hub.db'}"]
    done = subprocess.run(
        [sys.executable, "-m", "gpufed", *argv],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"gpufed hub: cannot open the store sqlite:///{store / 'hub.db'}: "
        "unable to open database file"
    ), done.stderr
    assert "Traceback" not in done.stderr
