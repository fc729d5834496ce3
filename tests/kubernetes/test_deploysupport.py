"""The deploy tests' generated trust (NATS keys, a local CA) lives as long as their run only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.kubernetes.deploysupport import ROOT

_MAKE = """
from tests.kubernetes.deploysupport import generated_auth, tls_dir_for_tests
auth, tls = generated_auth(), tls_dir_for_tests()
assert (auth / "hub" / "nats-auth.yaml").is_file() and (tls / "tls.key").is_file()
print(auth, tls)
"""


def test_the_keys_a_run_generates_for_the_deploy_tests_are_gone_when_it_ends() -> None:
    made = subprocess.run(
        [sys.executable, "-c", _MAKE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert made.returncode == 0, made.stderr
    folders = [Path(word) for word in made.stdout.split()]
    assert len(folders) == 2, made.stdout
    assert [f for f in folders if f.exists()] == []
