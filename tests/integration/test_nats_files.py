"""`gpufed spoke`, `hub`, `burst` and `region-streams` with a NATS credential or CA file they
cannot use: one line naming the flag and the file, exit status 1, at start (the real command
against a nats-server that wants credentials, as every gpufed one does), not a retry twice a
second for ever or a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bus.natsserver import EmbeddedNats
from bus.ports import free_port

GPUFED = str(Path(sys.executable).parent / "gpufed")
#: A guard only: the refusal comes before any connect; a command that tries to connect runs on.
RUN_LIMIT_S = 60


def _argv(command: str, nats: EmbeddedNats, tmp_path: Path) -> list[str]:
    """`command` as an operator starts it, but for the NATS file flags."""
    url = ["--nats-url", nats.url]
    if command == "spoke":
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text("nodes: [{name: n0, gpu_model: H100, gpu_count: 8}]\n")
        where = ["--state-dir", str(tmp_path / "state"), "--inventory", f"static:{inventory}"]
        return ["spoke", "--id", "eu-1", "--region", "eu", *url, *where]
    if command == "hub":
        return ["hub", *url, "--data-dir", str(tmp_path / "hub"), "--api-port", str(free_port())]
    if command == "burst":
        return ["burst", "--provider", "local", *url, "--state-dir", str(tmp_path / "burst")]
    return ["region-streams", *url, "--spoke", "eu-1"]


def _refused(command: str, nats: EmbeddedNats, tmp_path: Path, *flags: str) -> str:
    done = subprocess.run(
        [GPUFED, *_argv(command, nats, tmp_path), *flags],
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr.strip()


@pytest.mark.parametrize("command", ["spoke", "hub", "burst", "region-streams"])
@pytest.mark.parametrize(
    ("flag", "content", "says"),
    [
        ("--nats-creds", None, "No such file or directory: {path}"),
        (
            "--nats-creds",
            "not a credential\n",
            "not a NATS credentials file (a user JWT and its seed): {path}",
        ),
        ("--nats-ca", None, "No such file or directory: {path}"),
    ],
)
def test_an_unusable_nats_file_is_named_at_start(
    secure_nats: EmbeddedNats,
    tmp_path: Path,
    command: str,
    flag: str,
    content: str | None,
    says: str,
) -> None:
    path = tmp_path / "nats-file"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    err = _refused(command, secure_nats, tmp_path, flag, str(path))
    assert err == f"gpufed {command}: {flag}: {says.format(path=path)}"
