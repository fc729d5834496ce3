"""`gpufed replay` end to end: a generated trace in, report.json and PNG plots out."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PHILLY_SAMPLE = REPO / "tests" / "data" / "philly-sample.csv"  # 400 real jobs (README there)

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


def test_jobs_that_never_start_are_named_beside_the_averages(tmp_path: Path) -> None:
    # A 64-GPU job on a fleet of 2-node spokes never runs; the printed averages cover only the
    # other job, which used to be all a user saw (exit 0, nothing said).
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_time,duration,num_gpus,team\n0,100,64,vision\n0,50,1,nlp\n")
    args = ["--trace", str(trace), "--format", "csv", "--out", str(tmp_path / "out")]
    done = replay(tmp_path, *args, "--no-plots", "--quiet", "--no-fairness")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[0])["avg_jct_s"] == 50.0
    assert "1 of 2 jobs never started (1 shape_never_fits)" in done.stderr


def test_real_philly_sample_loads_every_job() -> None:
    from gpufed.replay.traces import load_trace

    jobs = load_trace(PHILLY_SAMPLE, "philly")
    assert len(jobs) == 400
    assert sum(1 for j in jobs if j.team == "11cb48") == 137
    assert all(a.submit <= b.submit for a, b in itertools.pairwise(jobs))
    assert jobs[0].submit == 0
    assert max(j.nodes for j in jobs) == 16  # the 128-GPU job: 16 nodes x 8


def test_real_philly_sample_replays_with_gangs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = [
        "--trace",
        str(PHILLY_SAMPLE),
        "--format",
        "philly",
        "--fleet",
        str(REPO / "bench" / "replay" / "philly-fleet.yaml"),
        "--policy",
        str(REPO / "bench" / "replay" / "philly-policy.yaml"),
        "--load-factor",
        "20",
        "--out",
        str(out),
        "--no-plots",
        "--quiet",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "gpufed.replay", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["jobs"]["total"] == 400 and report["jobs"]["finished"] == 400
    assert report["p99_wait_wide_s"] is not None  # the 32-, 64- and 128-GPU gangs ran
    for team in ("11cb48", "6214e9"):
        fairness = report["teams"][team]["finish_time_fairness"]
        assert fairness is not None and fairness <= 1.0


def openb_files(directory: Path, pods: int = 300, seed: int = 3) -> tuple[Path, Path]:
    """A pod list and a GPU node list in Alibaba's openb format (its own data has no licence)."""
    rng = random.Random(seed)
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    for i in range(40):
        nodes.append(f"node-{i},96000,786432,{rng.choice([2, 4, 8])},{rng.choice(['T4', 'G2'])}")
    rows = [
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
        "creation_time,deletion_time,scheduled_time"
    ]
    for i in range(pods):
        gpus = rng.choice([0, 1, 1, 1, 1, 2, 4, 8])
        milli = rng.choice([250, 500, 1000]) if gpus == 1 else 1000 * gpus
        qos = rng.choice(["LS", "BE", "Burstable"])
        rows.append(
            f"pod-{i},4000,16384,{gpus},{milli},,{qos},Running,{i * 10},{i * 10 + 600},{i * 10 + 1}"
        )
    (directory / "openb_node_list_gpu_node.csv").write_text("\n".join(nodes) + "\n")
    (directory / "openb_pod_list_default.csv").write_text("\n".join(rows) + "\n")
    return directory / "openb_pod_list_default.csv", directory / "openb_node_list_gpu_node.csv"


def test_alibaba_inflation_reports_the_allocated_share(tmp_path: Path) -> None:
    pods, node_list = openb_files(tmp_path)
    capacity = sum(int(line.split(",")[3]) for line in node_list.read_text().splitlines()[1:])
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
    assert report["capacity_gpus"] == capacity
    assert 0.5 < report["allocated_share"] < 1.0


def test_least_attained_service_cuts_waits_on_real_jobs(tmp_path: Path) -> None:
    """The Philly sample on 128 GPUs: fresh jobs take GPUs from jobs that ran for hours."""
    (tmp_path / "fleet.yaml").write_text(
        "spokes:\n  - id: dc-1\n    region: eu\n"
        "    nodes: [{prefix: a-, count: 16, gpu_model: P100, gpu_count: 8}]\n"
    )
    reports = {}
    for mode in ("fifo", "las"):
        (tmp_path / f"{mode}.yaml").write_text(f"version: 1\nordering: {{mode: {mode}}}\n")
        out = tmp_path / mode
        args = ["--trace", str(PHILLY_SAMPLE), "--format", "philly", "--out", str(out)]
        args += [
            "--fleet",
            str(tmp_path / "fleet.yaml"),
            "--policy",
            str(tmp_path / f"{mode}.yaml"),
        ]
        done = subprocess.run(
            [sys.executable, "-m", "gpufed.replay", *args, "--no-plots", "--quiet"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        reports[mode] = json.loads((out / "report.json").read_text())
    fifo, las = reports["fifo"], reports["las"]
    assert las["jobs"]["finished"] == fifo["jobs"]["finished"] == 400
    assert fifo["preemptions"] == 0 < las["preemptions"]
    assert las["avg_wait_s"] < fifo["avg_wait_s"]
    assert las["avg_bounded_slowdown"] < fifo["avg_bounded_slowdown"]
