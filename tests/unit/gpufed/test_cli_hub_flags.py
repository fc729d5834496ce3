"""`gpufed hub`'s settings from its flags: a bad value is refused before anything starts."""

from __future__ import annotations

import pytest

from gpufed import cli
from hub.settings import KEEP_ENDED_S, HubSettings


def _settings(*flags: str) -> HubSettings:
    args = cli._parser().parse_args(["hub", *flags])
    return cli._hub_settings(args)


def test_keep_ended_defaults_to_ninety_days_and_takes_seconds() -> None:
    assert _settings().keep_ended_s == KEEP_ENDED_S == 90 * 24 * 3600
    assert _settings("--keep-ended", "3600").keep_ended_s == 3600


def test_a_keep_of_zero_is_refused_naming_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hub", "--keep-ended", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpufed hub:") and "keep_ended_s" in err
