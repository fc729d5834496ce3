"""`gpufed spoke` with a NATS credential or CA file it cannot use: one line naming the flag
and the file, exit status 1, at start (the real command against a nats-server that wants
credentials, as every gpufed one does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bus.natsserver import EmbeddedNats

GPUFED = str(Path(sys.executable).parent / "gpufed")
#: A guard only: the refusal comes before any connect; a spoke that tries to connect runs on.
RUN_LIMIT_S = 60


def _spoke(nats: EmbeddedNats, tmp_path: Path, *flags: str) -> str:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes: [{name: n0, gpu_model: H100, gpu_count: 8}]\n")
    where = ["--nats-url", nats.url, "--state-dir", str(tmp_path / "state")]
    what = ["--inventory", f"static:{inventory}"]
    done = subprocess.run(
        [GPUFED, "spoke", "--id", "eu-1", "--region", "eu", *where, *what, *flags],
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
    secure_nats: EmbeddedNats, tmp_path: Path, flag: str, content: str | None, says: str
) -> None:
    path = tmp_path / "nats-file"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    err = _spoke(secure_nats, tmp_path, flag, str(path))
    assert err == f"gpufed spoke: {flag}: {says.format(path=path)}"
