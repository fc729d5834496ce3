"""`gpufed hub`'s settings from its flags: a bad value is refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufed import cli
from hub.settings import KEEP_ENDED_S, HubSettings


def _settings(*flags: str) -> HubSettings:
    args = cli._parser().parse_args(["hub", *flags])
    return cli._hub_settings(args)


def test_keep_ended_defaults_to_ninety_days_and_takes_seconds() -> None:
    assert _settings().keep_ended_s == KEEP_ENDED_S == 90 * 24 * 3600
    assert _settings("--keep-ended", "3600").keep_ended_s == 3600


def test_a_keep_of_zero_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["hub", "--keep-ended", "0"]) == 1
    assert capsys.readouterr().err == "gpufed hub: --keep-ended: Input should be greater than 0\n"


def test_audit_refusals_lists_ten_alike_a_minute_unless_told(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _settings().audit_refusals_listed == 10
    assert _settings("--audit-refusals", "0").audit_refusals_listed == 0  # every one listed
    assert cli.main(["hub", "--audit-refusals", "-1"]) == 1
    assert capsys.readouterr().err == (
        "gpufed hub: --audit-refusals: Input should be greater than or equal to 0\n"
    )


def test_api_rate_limits_twenty_a_second_and_two_hundred_at_once_unless_told(
    capsys: pytest.CaptureFixture[str],
) -> None:
    defaults = _settings()
    assert (defaults.api_rate_per_s, defaults.api_burst) == (20.0, 200)
    told = _settings("--api-rate", "0", "--api-burst", "50")
    assert (told.api_rate_per_s, told.api_burst) == (0.0, 50)  # 0: no limit
    assert cli.main(["hub", "--api-rate", "-1", "--api-burst", "0"]) == 1
    assert capsys.readouterr().err == (
        "gpufed hub: --api-rate: Input should be greater than or equal to 0; "
        "--api-burst: Input should be greater than or equal to 1\n"
    )


def test_bad_spoke_settings_are_each_named_by_their_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["spoke", "--id", "bad id", "--region", "eu", "--heartbeat", "-1", "--price", "-2"]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == (
        "gpufed spoke: --id: must be letters, digits, '_' and '-', starting with a letter or "
        "digit (at most 48) (not 'bad id'); --heartbeat: Input should be greater than 0; "
        "--price: Input should be greater than or equal to 0\n"
    )


def test_a_url_host_may_hold_the_workload_id_and_nothing_else_in_braces(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["spoke", "--id", "eu-1", "--region", "eu", "--expose-url-host", "{port}.gpu.example"]
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == (
        "gpufed spoke: --expose-url-host: '{port}.gpu.example': with {id} (each session's and "
        "service's workload id) it must be a host name (letters, digits, '-' and '.') with "
        "nothing else in braces, e.g. {id}.sessions.gpu.example.com\n"
    )
    argv[-1] = "nb_{id}.gpu.example"  # not a host name once the id is in it
    assert cli.main(argv) == 1
    assert "--expose-url-host: 'nb_{id}.gpu.example': with {id}" in capsys.readouterr().err


def test_the_static_admin_token_comes_from_a_file_never_from_argv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token = tmp_path / "admin-token"
    token.write_text("s3cret-admin\n")
    assert _settings("--admin-token-file", str(token)).admin_token == "s3cret-admin"
    # On the command line it would be in every `ps` listing: refused before anything starts.
    assert cli.main(["hub", "--admin-token", "s3cret-admin"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpufed hub: --admin-token: ") and "--admin-token-file" in err
    assert "s3cret-admin" not in err


def test_a_bad_burst_id_prefix_is_refused_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["burst", "--id-prefix", "bad prefix!"]) == 1
    assert capsys.readouterr().err == (
        "gpufed burst: --id-prefix: must be letters, digits, '_' and '-', starting with a letter "
        "or digit (at most 16) (not 'bad prefix!')\n"
    )
