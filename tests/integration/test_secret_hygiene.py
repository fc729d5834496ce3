"""Secrets stay where they belong: not in a workload's environment, not in argv, not in logs."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bus.client import Bus
from bus.ports import free_port
from gpufed.up import Federation, SimSpoke
from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes

pytestmark = [pytest.mark.integration, pytest.mark.security]


async def test_a_workload_sees_an_allowlist_and_its_own_env_only(
    fed: InProcessFederation, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a spoke host typically has in its environment.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("GPUFED_NATS_URL", "nats://spoke:nats-password@hub:4222")
    monkeypatch.setenv("GPUFED_NATS_TOKEN", "nats-token-value")
    monkeypatch.setenv("GPUFED_NATS_CREDS", "/etc/gpufed/spoke.creds")
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    out = tmp_path / "env.txt"
    wid = await fed.submit(
        name="printenv",
        team="t",
        gpus_per_node=1,
        command=["sh", "-c", f"env > {out}"],
        env={"MY_SETTING": "mine"},
    )
    await fed.wait_phase(wid, {Phase.SUCCEEDED})
    seen = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    for secret in ("aws-secret-value", "nats-password", "nats-token-value", "spoke.creds"):
        assert secret not in out.read_text()
    assert seen["MY_SETTING"] == "mine"
    assert seen["CUDA_VISIBLE_DEVICES"] == "0"
    assert seen["GPUFED_WORKLOAD_ID"] == wid
    assert "PATH" in seen


def _others_can_read(path: Path, below: Path) -> bool:
    """Whether another local user can read `path`: every folder from `below` down lets others
    through, and the file lets them read (from the modes: the tests may run as root)."""
    folders = [p for p in path.parents if p.is_relative_to(below) and p != below]
    through = all(stat.S_IMODE(f.stat().st_mode) & 0o001 for f in folders)
    return bool(through and stat.S_IMODE(path.stat().st_mode) & 0o004)


async def test_a_secret_env_value_at_rest_is_readable_by_its_owner_only(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    value = "hf-secret-at-rest-4711"
    wid = await fed.submit(
        name="secret", team="t", gpus_per_node=1, command=["true"],
        env={"HF_TOKEN": {"value": value, "secret": True}},
    )  # fmt: skip
    await fed.wait_phase(wid, {Phase.SUCCEEDED})
    holding = [
        path
        for path in fed.root.rglob("*")
        if path.is_file() and value.encode() in path.read_bytes()
    ]
    names = {p.name for p in holding}
    assert {"runs.jsonl", "hub.db-wal"} <= names  # the spoke's runs, the hub's store
    assert [p for p in holding if _others_can_read(p, fed.root)] == []


_CONNECT_ONCE = """
import asyncio, sys
from bus.client import Bus, BusSettings
from gpufed.logs import configure
configure(sys.stderr)
bus = Bus(BusSettings(url=sys.argv[1], connect_timeout_s=0.2))
try:
    asyncio.run(bus.connect(first_attempt_timeout_s=0.5))
except Exception:
    pass
"""


def test_a_password_in_a_nats_url_is_never_logged() -> None:
    # A fresh process, logging set up as `gpufed` does it: what an operator reads on stderr.
    url = f"nats://hub:s3cret-pw@127.0.0.1:{free_port()},nats://tok3n-value@127.0.0.1:1"
    done = subprocess.run(
        [sys.executable, "-c", _CONNECT_ONCE, url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    text = done.stdout + done.stderr
    assert "nats_connect_retry" in text, "the retries are logged"
    assert "s3cret-pw" not in text and "tok3n-value" not in text
    assert "nats://hub:***@127.0.0.1" in text


def test_gpufed_up_puts_no_secret_in_argv_and_keeps_creds_files_private(tmp_path: Path) -> None:
    fed = Federation(tmp_path / "fed", 0, (SimSpoke("eu-1", "eu", 1, 1, "H100"),), burst_args=())
    (fed.data_dir / "logs").mkdir(parents=True, exist_ok=True)
    try:
        fed.nats.start()
        fed.start_hub()
        fed.start_spoke(fed.spoke("eu-1"))
        fed.start_burst()
        time.sleep(0.5)  # let them exec: argv is read from /proc
        creds = sorted((fed.secrets_dir / "creds").glob("*.creds"))
        assert {c.stem for c in creds} == {"hub", "spoke-eu-1", "burst"}
        secrets = [c.read_text() for c in creds]
        secrets.append((fed.secrets_dir / "burst-issuer.json").read_text())
        for path in [*creds, fed.secrets_dir / "burst-issuer.json"]:
            assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        assert stat.S_IMODE(fed.secrets_dir.stat().st_mode) == 0o700
        for name, proc in fed.procs.items():
            argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
            assert "--nats-creds" in argv, name
            seeds = re.findall(r"S[OAU][A-Z2-7]{50,}", "\n".join(secrets))
            assert len(seeds) >= 5  # three users, two signing keys
            for seed in seeds:
                assert seed not in argv, name
            assert "eyJ" not in argv, name  # no JWT either
        nats_argv = Path(f"/proc/{fed.nats.pid}/cmdline").read_bytes().decode()
        assert "-c" in nats_argv and "SU" not in nats_argv.replace("-", "")
    finally:
        fed.stop()


async def test_gpufed_up_tls_clients_verify_the_local_ca(tmp_path: Path) -> None:
    fed = Federation(tmp_path / "fed", 0, (), tls=True)
    try:
        fed.nats.start()
        assert fed.nats.url.startswith("tls://")
        bus = Bus(fed.client_settings("tls-check"))
        await bus.connect(first_attempt_timeout_s=5)
        assert bus.nc.is_connected
        await bus.close()
        # Without the CA the server's certificate is not trusted.
        bus = Bus(dataclasses.replace(fed.client_settings("no-ca"), tls_ca=None))
        with pytest.raises(Exception):  # noqa: B017 - the handshake fails (certificate)
            await asyncio.wait_for(bus.connect(first_attempt_timeout_s=1), 10)
    finally:
        fed.stop()
