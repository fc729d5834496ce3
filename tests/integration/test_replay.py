"""`gpufed replay` end to end: a generated trace in, report.json and PNG plots out."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRACES = REPO.parent / "shared" / "traces"

FLEET = """
spokes:
  - id: dc-1
    region: eu
    nodes: [{prefix: a-, count: 2, gpu_model: A100, gpu_count: 8}]
  - id: dc-2
    region: us
    nodes: [{prefix: b-, count: 2, gpu_model: A100, gpu_count: 8}]
"""

POLICY = """
version: 1
teams:
  - {name: vision, may_burst: true, quotas: {A100: {guaranteed: 16}}}
  - {name: nlp, may_burst: true, quotas: {A100: {guaranteed: 16}}}
"""


def generated_trace(path: Path, jobs: int = 120, seed: int = 7) -> Path:
    """Vision is busy, nlp mostly idle; a few wide jobs become gangs."""
    rng = random.Random(seed)
    rows = ["submit_time,duration,num_gpus,team"]
    for i in range(jobs):
        team = "vision" if rng.random() < 0.8 else "nlp"
        gpus = rng.choice([1, 1, 2, 4, 8, 16])
        rows.append(f"{i * 30},{rng.randint(60, 3000)},{gpus},{team}")
    path.write_text("\n".join(rows) + "\n")
    return path


def replay(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "fleet.yaml").write_text(FLEET)
    (tmp_path / "policy.yaml").write_text(POLICY)
    command = [
        sys.executable,
        "-m",
        "gpufed.replay",
        "--fleet",
        str(tmp_path / "fleet.yaml"),
        "--policy",
        str(tmp_path / "policy.yaml"),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_replay_writes_the_report_and_plots(tmp_path: Path) -> None:
    trace = generated_trace(tmp_path / "jobs.csv")
    out = tmp_path / "out"
    done = replay(tmp_path, "--trace", str(trace), "--format", "csv", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "% done" in done.stderr  # progress on stderr
    report = json.loads((out / "report.json").read_text())
    assert report["scheduler"] == "gpufed" and report["burst"] == "none"
    assert report["jobs"] == {
        "total": 120,
        "finished": 120,
        "never_started": 0,
        "never_started_by_reason": {},
        "never_started_by_team": {},
    }
    assert 0 < report["utilization"] <= 1
    assert report["avg_jct_s"] >= report["p50_jct_s"] > 0
    assert report["fleet"]["onprem_gpus"] == 32
    fairness = report["teams"]["vision"]["finish_time_fairness"]
    assert fairness is not None and fairness <= 1.0  # busy team gains from sharing
    for name in ("utilization.png", "queueing_delay_cdf.png", "team_share.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replay_with_burst_reports_cloud_cost(tmp_path: Path) -> None:
    trace = generated_trace(tmp_path / "jobs.csv", jobs=200)
    out = tmp_path / "out"
    args = ["--trace", str(trace), "--format", "csv", "--out", str(out), "--load-factor", "6"]
    done = replay(tmp_path, *args, "--burst", "immediate", "--no-plots", "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    report = json.loads((out / "report.json").read_text())
    assert report["cloud_instances"] > 0 and report["cloud_cost"] > 0
    assert report["trace"]["load_factor"] == 6.0
    assert not (out / "utilization.png").exists()


def test_bad_trace_row_is_reported_with_line_and_column(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_time,duration,num_gpus,team\n0,10,1,vision\n5,ten,1,vision\n")
    done = replay(tmp_path, "--trace", str(trace), "--format", "csv", "--out", str(tmp_path))
    assert done.returncode == 1
    assert "line 3, column duration: 'ten' is not a number" in done.stderr
    assert not (tmp_path / "report.json").exists()


def test_real_philly_trace_loads_every_job() -> None:
    path = TRACES / "philly-pollux" / "philly.csv"
    if not path.exists():
        pytest.skip(f"Philly trace not found at {path} (../shared/traces beside the repo)")
    from gpufed.replay.traces import load_trace

    jobs = load_trace(path, "philly")
    assert len(jobs) == 82_247
    assert sum(1 for j in jobs if j.team == "6214e9") == 41_226
    assert all(a.submit <= b.submit for a, b in itertools.pairwise(jobs))
    assert max(j.nodes for j in jobs) == 16  # 128-GPU jobs: 16 nodes x 8


def test_alibaba_inflation_reports_the_allocated_share(tmp_path: Path) -> None:
    pods = TRACES / "alibaba-gpu-v2023" / "openb_pod_list_default.csv"
    if not pods.exists():
        pytest.skip(f"Alibaba trace not found at {pods} (../shared/traces beside the repo)")
    out = tmp_path / "out"
    args = ["--trace", str(pods), "--format", "alibaba", "--inflate", "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "gpufed.replay", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["capacity_gpus"] == 6212
    assert 0.5 < report["allocated_share"] < 1.0
