"""`gpufed burst` flags become BurstSettings and the planner's policy."""

from __future__ import annotations

import argparse
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from burst.core.model import MarketPreference, TeamBudget
from burst.errors import CatalogError
from gpufed import logs
from gpufed.burst_entry import add_burst_parser, main, settings_from_args
from gpufed.compose.burst import build_burst


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpufed")
    add_burst_parser(parser.add_subparsers())
    return parser.parse_args(["burst", *flags])


def test_unset_flags_keep_the_defaults() -> None:
    settings = settings_from_args(parse())
    assert (settings.provider, settings.tick_s, settings.max_instances) == ("local", 2.0, 10)
    assert settings.policy().burst_after_s == 60.0


def test_flags_reach_the_policy() -> None:
    flags = [
        "--burst-after", "5", "--idle-ttl", "30", "--cooldown", "10",
        "--unlimited-instances", "--max-dollars-per-hour", "40",
        "--allow-team", "ml", "--allow-team", "cv",
        "--team-budget", "ml=20,500", "--team-budget", "cv=,100",
        "--markets", "on_demand_only", "--state-dir", "/tmp/x",
        "--wait-per-gpu", "45", "--right-size", "--no-burst-restarted",
    ]  # fmt: skip
    settings = settings_from_args(parse(*flags))
    policy = settings.policy()
    assert (policy.burst_after_s, policy.idle_ttl_s, policy.cooldown_s) == (5, 30, 10)
    assert policy.max_instances is None
    assert policy.max_dollars_per_hour == 40
    assert policy.allowed_teams == frozenset({"ml", "cv"})
    assert policy.team_budgets == {"ml": TeamBudget(20, 500), "cv": TeamBudget(None, 100)}
    assert policy.markets is MarketPreference.ON_DEMAND_ONLY
    assert (policy.wait_per_gpu_s, policy.right_size, policy.burst_restarted) == (45, True, False)
    assert settings_from_args(parse("--no-right-size")).policy().right_size is False
    assert settings.state_dir == Path("/tmp/x")


def test_aws_plans_only_in_its_region() -> None:
    settings = settings_from_args(parse("--provider", "aws", "--aws-region", "eu-west-1"))
    assert settings.policy().regions == frozenset({"eu-west-1"})
    both = settings_from_args(
        parse("--provider", "aws", "--aws-region", "eu-west-1", "--region", "us-east-1")
    )
    assert both.policy().regions == frozenset()  # nothing this provider can launch


@pytest.mark.security
def test_the_nats_url_may_come_from_a_mounted_file(tmp_path: Path) -> None:
    url = tmp_path / "url"
    url.write_text("tls://gpufed-nats:4222\n")
    assert settings_from_args(parse("--nats-url-file", str(url))).nats_url == (
        "tls://gpufed-nats:4222"
    )
    with pytest.raises(ValueError, match="--nats-url-file: No such file"):
        settings_from_args(parse("--nats-url-file", str(tmp_path / "missing")))


def test_bad_values_are_refused() -> None:
    with pytest.raises(ValueError, match="TEAM=PER_HOUR"):
        settings_from_args(parse("--team-budget", "ml"))
    with pytest.raises(ValidationError):
        settings_from_args(parse("--idle-ttl", "-1"))
    try:
        assert main(["--provider", "aws"]) == 1  # no --aws-image-id: a message, no traceback
    finally:
        logs.configure(sys.stderr, json=False, level="warning")  # as tests/conftest.py does


def test_a_bad_setting_is_named_by_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tick", "-1", "--idle-ttl", "-1"]) == 1
    assert capsys.readouterr().err == (
        "gpufed burst: --tick: Input should be greater than 0; "
        "--idle-ttl: Input should be greater than or equal to 0\n"
    )


def test_sigterm_stops_gpufed_burst_while_nats_is_unreachable(tmp_path: Path) -> None:
    """A controller started before its NATS server (or cut off from it) retries the connect;
    told to stop meanwhile, it exits rather than retrying for ever (until SIGKILL)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(30)  # a guard: the controller dials within moments
        port = server.getsockname()[1]
        url, state = f"nats://127.0.0.1:{port}", str(tmp_path / "burst")
        burst = subprocess.Popen(
            [sys.executable, "-m", "gpufed", "burst", "--nats-url", url, "--state-dir", state],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            conn, _ = server.accept()  # its first connect attempt: not a NATS server
            conn.close()
            burst.send_signal(signal.SIGTERM)
            assert burst.wait(timeout=30) == 0
        finally:
            if burst.poll() is None:
                burst.kill()
                burst.wait()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--aws-region", "ap-south-1"), "burst may launch in ap-south-1, where the default"),
        (("--aws-region", "eu-west-1", "--region", "us-east-1"), "--region leaves out"),
    ],
)
def test_a_controller_that_could_never_launch_is_refused_at_start(
    flags: tuple[str, ...], message: str
) -> None:
    """The default catalog prices us-east-1, us-west-2 and eu-west-1: an AWS controller in
    another region would skip every demand as `no_offer`, seen only in its log."""
    settings = settings_from_args(parse("--provider", "aws", "--aws-image-id", "ami-1", *flags))
    with pytest.raises(CatalogError, match=re.escape(message)):
        build_burst(settings)
    local = settings_from_args(parse("--region", "eu"))  # the local provider, same catalog
    with pytest.raises(CatalogError, match="burst may launch in eu, where"):
        build_burst(local)
