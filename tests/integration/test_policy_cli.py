"""`gpufed policy set` against a real hub and spoke: a quota for a model no spoke has (a typing
slip) is set as written, and the command says so; one in another case is the fleet's model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufed.cli import main
from gpufed.up import Federation, SimSpoke


@pytest.fixture
def fed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Federation]:
    federation = Federation(tmp_path / ".gpufed", 0, fleet=(SimSpoke("eu-1", "eu", 1, 8, "H100"),))
    federation.start(timeout_s=60)
    monkeypatch.chdir(tmp_path)  # the CLI finds `gpufed up`'s admin token beside it
    monkeypatch.setenv("GPUFED_API", federation.api_url)
    for name in ("GPUFED_TOKEN", "GPUFED_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    try:
        yield federation
    finally:
        federation.stop()


def test_a_quota_for_a_model_no_spoke_has_is_set_and_warned_of(
    fed: Federation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("teams:\n  - name: vision\n    quotas:\n      H10O: {guaranteed: 4}\n")
    assert main(["policy", "set", str(policy)]) == 0
    out, err = capsys.readouterr()
    assert out == "policy in force: 1 teams\n"
    assert err == (
        "gpufed policy set: warning: no spoke has GPU model H10O now (quotas of team vision); "
        "did you mean H100?\n"
    )


def test_a_quota_in_another_case_is_the_fleets_model(
    fed: Federation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("teams:\n  - name: vision\n    quotas:\n      h100: {guaranteed: 4}\n")
    assert main(["policy", "set", str(policy)]) == 0
    assert capsys.readouterr().err == ""  # no warning: the spoke's H100 is the quota's
    assert main(["policy", "show"]) == 0
    shown = capsys.readouterr().out
    assert "H100:" in shown and "h100" not in shown


def test_a_token_for_a_team_the_policy_does_not_list_is_warned_of(
    fed: Federation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("teams:\n  - name: vision\n  - name: nlp\n")
    assert main(["policy", "set", str(policy)]) == 0
    capsys.readouterr()
    argv = ["token", "create", "--user", "bob", "--role", "member", "--team"]
    assert main([*argv, "visoin"]) == 0  # minted all the same: a team may be new
    out, err = capsys.readouterr()
    assert out.splitlines()[-1].startswith("gpufed_")
    assert err == (
        "gpufed token create: warning: team visoin is not in the policy (its work gets the "
        "default team's quotas); did you mean vision?\n"
    )
    assert main([*argv, "nlp"]) == 0
    assert capsys.readouterr().err == ""


def test_a_window_listed_after_one_in_force_whenever_it_is_is_warned_of(
    fed: Federation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "teams: [{name: vision}]\n"
        "windows:\n"
        "  - {name: always, start: '00:00', end: '24:00'}\n"
        "  - {name: night, start: '22:00', end: '06:00', teams: {vision: {weight: 3}}}\n"
    )
    assert main(["policy", "set", str(policy)]) == 0  # set as written: the first window wins
    assert capsys.readouterr().err == (
        "gpufed policy set: warning: window night never applies: window always, listed before "
        "it, is in force whenever it is\n"
    )
