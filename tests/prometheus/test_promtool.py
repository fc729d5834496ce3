"""The shipped Prometheus config and alert rules, checked and unit-tested by promtool."""

from __future__ import annotations

import subprocess

from tests.prometheus.conftest import DEPLOY


def promtool_run(promtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *args], cwd=DEPLOY, capture_output=True, text=True, timeout=60, check=False
    )


def test_the_config_is_valid_and_loads_the_rules(promtool: str) -> None:
    result = promtool_run(promtool, "check", "config", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 rule files found" in result.stdout
    assert "WARNING" not in result.stdout + result.stderr


def test_the_rules_are_valid(promtool: str) -> None:
    result = promtool_run(promtool, "check", "rules", "rules/gpufed.rules.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_fire_when_they_should_and_only_then(promtool: str) -> None:
    result = promtool_run(promtool, "test", "rules", "tests/gpufed.rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_the_issue_names_has_a_rule_test() -> None:
    import yaml

    rules = yaml.safe_load((DEPLOY / "rules/gpufed.rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tests = yaml.safe_load((DEPLOY / "tests/gpufed.rules_test.yml").read_text())
    tested = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", [])}
    assert alerts == tested
    assert {
        "GpufedSpokeLost",
        "GpufedTeamStarving",
        "GpufedGpusIdleWhileWorkQueues",
        "GpufedBurstBudget80",
        "GpufedSlowCycles",
    } <= alerts
