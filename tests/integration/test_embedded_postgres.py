"""The embedded PostgreSQL (`gpufed up --hubs 2`, the tests) takes password logins only: another
local user reaching 127.0.0.1 must not get a superuser, who could run programs and mint tokens."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from gpufed.postgres import EmbeddedPostgres

pytestmark = [pytest.mark.integration, pytest.mark.security]


@pytest.fixture
def roots(tmp_path: Path) -> Iterator[Callable[[], Path]]:
    """Makes a folder for a server of its own."""
    made: list[Path] = []

    def make() -> Path:
        # Under root, pytest's tmp dirs sit in a 0700 root folder the server's user cannot
        # enter.
        if os.geteuid() == 0:
            made.append(Path(tempfile.mkdtemp(prefix="gpufed-pg-")))
            return made[-1]
        return Path(tempfile.mkdtemp(dir=tmp_path))

    try:
        yield make
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def _refused(url: str) -> str:
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(url, connect_timeout=5).close()
    return str(refused.value)


def test_a_login_without_the_password_is_refused_even_on_a_cluster_made_before_them(
    roots: Callable[[], Path],
) -> None:
    root = roots()
    server = EmbeddedPostgres(root).start()
    try:
        assert stat.S_IMODE(server.password_file.stat().st_mode) == 0o600
        password = server.password_file.read_text().strip()
        assert len(password) >= 40
        psycopg.connect(server.admin_url(), connect_timeout=5).close()
        bare = f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        assert "no password supplied" in _refused(bare)
        wrong = f"postgresql://postgres:{password[:-1]}x@127.0.0.1:{server.port}/postgres"
        assert "password authentication failed" in _refused(wrong)
    finally:
        server.stop()

    # A cluster from before passwords: every loopback login trusted, no password file.
    hba = root / "data" / "pg_hba.conf"
    with open(hba, "w", encoding="utf-8") as out:  # in place: the server's user owns it
        out.write("host all all 127.0.0.1/32 trust\n")
    server.password_file.unlink()
    again = EmbeddedPostgres(root).start()
    try:
        assert "no password supplied" in _refused(
            f"postgresql://postgres@127.0.0.1:{again.port}/postgres"
        )
        assert again.password_file.read_text().strip() != password  # a new one, set anew
        psycopg.connect(again.admin_url(), connect_timeout=5).close()
        assert password not in (root / "postgres.log").read_text()
    finally:
        again.stop()


def test_a_durable_server_keeps_fsync_and_a_throwaway_one_does_not(
    roots: Callable[[], Path],
) -> None:
    """`gpufed up --hubs 2` keeps its store between runs: a power cut must not corrupt it."""
    for durable, expected in ((True, "on"), (False, "off")):
        server = EmbeddedPostgres(roots(), durable).start()
        try:
            with psycopg.connect(server.admin_url(), connect_timeout=5) as conn:
                for name in ("fsync", "full_page_writes", "synchronous_commit"):
                    row = conn.execute(f"SHOW {name}").fetchone()
                    assert row is not None and row[0] == expected, (durable, name)
        finally:
            server.stop()
