"""A spec or policy file the user names that cannot be used: one line naming the file and what
is wrong, exit status 1, and nothing sent to the hub (no traceback, no half-read policy)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bus.ports import free_port
from gpufed import cli


@pytest.fixture(autouse=True)
def _no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """An API address where nothing listens: a command that reached for it would say so."""
    monkeypatch.setenv("GPUFED_API", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("GPUFED_TOKEN", "gpufed_unused")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert cli.main(list(argv)) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot reach the hub" not in err
    assert len(err.strip().splitlines()) == 1
    return err.strip()


def test_a_missing_file_is_named_for_submit_service_and_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yaml"
    for argv in (
        ("submit", "-f", str(missing)),
        ("service", "create", "-f", str(missing)),
        ("policy", "set", str(missing)),
    ):
        err = _run(capsys, *argv)
        assert err == f"gpufed: {missing}: cannot read it: No such file or directory", argv


def test_bad_yaml_says_where(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\ncommand: [sh, -c\n")
    err = _run(capsys, "submit", "-f", str(spec))
    assert err.startswith(f"gpufed: {spec}: not valid YAML at line 3, column 1: ")


def test_a_list_is_not_a_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text("- name: x\n")
    err = _run(capsys, "service", "create", "-f", str(spec))
    assert err == f"gpufed: {spec}: must hold a mapping (key: value lines), not a list"


def test_an_empty_policy_file_is_refused_not_sent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "policy.yaml"
    empty.write_text("# nothing yet\n")
    err = _run(capsys, "policy", "set", str(empty))
    assert err == f"gpufed: {empty}: is empty; it must hold a mapping (key: value lines)"
