"""A live federation (`gpufed up`'s processes) scraped by a real Prometheus, and the CLI's views
of it: `gpufed jobs`, `logs -f`, `top` and `usage`."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bus.ports import free_port
from gpufed.client import HubClient
from gpufed.up import Federation, SimSpoke
from tests.prometheus.conftest import DEPLOY, debian_tool

FLEET = (
    SimSpoke("eu-1", "eu", nodes=1, gpus=2, model="H100"),
    SimSpoke("us-1", "us", nodes=1, gpus=2, model="L4"),
)


class Live:
    def __init__(self, fed: Federation, client: HubClient) -> None:
        self.fed = fed
        self.client = client
        self.jobs: dict[str, str] = {}

    def cli(
        self, *args: str, timeout: float = 30, stdout: int = subprocess.PIPE
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "GPUFED_TOKEN_FILE": str(self.fed.token_file)}
        env.pop("GPUFED_TOKEN", None)
        return subprocess.run(
            [sys.executable, "-m", "gpufed", *args, "--api", self.fed.api_url],
            env=env,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=timeout,
            check=False,
        )


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    fed = Federation(tmp_path_factory.mktemp("fed"), 0, FLEET, burst_args=())
    client: HubClient | None = None
    try:
        fed.start()
        client = fed.client()
        live = Live(fed, client)
        submit = client.submit
        # eu-1: a job that says its GPUs idle at 2 %; another that waits behind it.
        live.jobs["idle"] = submit(
            {
                "name": "notebook",
                "team": "vision",
                "gpus_per_node": 2,
                "gpu_models": ["H100"],
                "command": ["sh", "-c", 'echo 2 > "$GPUFED_LOAD_FILE"; echo ready; sleep 300'],
            }
        )["id"]
        live.jobs["waits"] = submit(
            {
                "name": "waiter",
                "team": "nlp",
                "gpus_per_node": 1,
                "gpu_models": ["H100"],
                "priority_class": "batch",  # a higher class would preempt the notebook
                "command": ["true"],
            }
        )["id"]
        # us-1: a job that talks for a while, then ends.
        live.jobs["talk"] = submit(
            {
                "name": "talker",
                "team": "nlp",
                "gpus_per_node": 1,
                "gpu_models": ["L4"],
                "command": ["sh", "-c", "for i in $(seq 1 8); do echo step-$i; sleep 0.25; done"],
            }
        )["id"]
        live.jobs["fails"] = submit(
            {
                "name": "broken",
                "team": "nlp",
                "gpus_per_node": 1,
                "gpu_models": ["L4"],
                "command": ["sh", "-c", "exit 3"],
            }
        )["id"]
        wait_for(lambda: client.workload(live.jobs["idle"])["phase"] == "running")
        yield live
    finally:
        if client is not None:
            client.close()
        fed.stop()


def wait_for(check: Callable[[], Any], timeout: float = 30.0, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s: {check}")
        time.sleep(every)


@pytest.fixture(scope="module")
def prometheus(live: Live, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = debian_tool("prometheus")
    root = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(DEPLOY / r) for r in config["rule_files"]]
    targets = live.fed.write_scrape_targets()
    config["scrape_configs"] = [
        {"job_name": "gpufed", "file_sd_configs": [{"files": [str(targets)]}]}
    ]
    (root / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (root / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url, proc, root), timeout=30)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _ready(url: str, proc: subprocess.Popen[bytes], root: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError((root / "prometheus.log").read_text()[-3000:])
    try:
        return httpx.get(f"{url}/-/ready", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def query(url: str, promql: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{url}/api/v1/query", params={"query": promql}, timeout=5)
    body = response.json()
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def values(url: str, promql: str, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in query(url, promql)}


def test_prometheus_scrapes_every_piece_and_loads_the_alerts(live: Live, prometheus: str) -> None:
    ports = live.fed.metrics_ports
    instances = {f"127.0.0.1:{live.fed.api_port}"} | {f"127.0.0.1:{p}" for p in ports.values()}
    wait_for(lambda: set(values(prometheus, "up == 1", "instance")) == instances)
    jobs = values(prometheus, "count by (job) (up)", "job")
    assert jobs == {"gpufed-hub": 1, "gpufed-spoke": 2, "gpufed-burst": 1}

    capacity = values(prometheus, "gpufed_gpus_capacity", "spoke")
    assert capacity == {"eu-1": 2, "us-1": 2}
    leases = values(prometheus, 'gpufed_spoke_lease{state="ready"}', "spoke")
    assert leases == {"eu-1": 1, "us-1": 1}
    waiting = wait_for(lambda: values(prometheus, "gpufed_queue_workloads", "team"))
    assert waiting == {"nlp": 1}
    # The notebook said it keeps its two H100s 2 % busy; nothing else runs on eu-1.
    util = wait_for(lambda: values(prometheus, 'DCGM_FI_DEV_GPU_UTIL{spoke="eu-1"}', "gpu") or None)
    assert util == {"0": 2.0, "1": 2.0}
    held = values(prometheus, 'gpufed_gpu_allocated{spoke="eu-1"}', "gpu")
    assert held == {"0": 1.0, "1": 1.0}
    placed = values(prometheus, "gpufed_placements_total", "job")
    assert placed["gpufed-hub"] >= 2
    assert query(prometheus, "gpufed_burst_spend_rate_dollars_per_hour")
    assert query(prometheus, "gpufed_cycle_duration_seconds_count > 0")

    rules = httpx.get(f"{prometheus}/api/v1/rules", timeout=5).json()["data"]["groups"]
    loaded = {r["name"]: r["health"] for g in rules for r in g["rules"]}
    assert set(loaded) >= {"GpufedSpokeLost", "GpufedTeamStarving", "GpufedSlowCycles"}
    wait_for(lambda: _rules_evaluated(prometheus))


def _rules_evaluated(url: str) -> bool:
    groups = httpx.get(f"{url}/api/v1/rules", timeout=5).json()["data"]["groups"]
    return all(r["health"] == "ok" for g in groups for r in g["rules"])


def test_jobs_shows_priority_and_queue_position(live: Live) -> None:
    wait_for(lambda: live.client.workload(live.jobs["waits"])["position"] == 1)
    result = live.cli("jobs")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[:7] == ["ID", "NAME", "TEAM", "CLASS", "PRIO", "POS", "GPUS"]
    waiter = next(r for r in rows if r.startswith(live.jobs["waits"])).split()
    assert waiter[1:6] == ["waiter", "nlp", "batch", "100", "1"]
    notebook = next(r for r in rows if r.startswith(live.jobs["idle"])).split()
    assert notebook[4:6] == ["100", "-"]  # batch, and not queued
    # How long so far: the waiter's wait and the notebook's run, not "-" until they end.
    assert waiter[7] == "queued" and float(waiter[9].removesuffix("s")) > 0
    assert notebook[7] == "running" and float(notebook[10].removesuffix("s")) > 0
    # Why a job failed, without its log's path on the spoke (`gpufed logs` reads it).
    wait_for(lambda: live.client.workload(live.jobs["fails"])["phase"] == "failed")
    broken = next(r for r in live.cli("jobs").stdout.splitlines() if "broken" in r)
    assert broken.split()[7] == "failed" and broken.endswith("  exit code 3")
    # Into a pipe whose reader has gone (`gpufed jobs | head`): no traceback.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        cut = live.cli("jobs", stdout=write_end)
    finally:
        os.close(write_end)
    assert cut.returncode == 1 and "Traceback" not in cut.stderr and cut.stderr == ""


def test_logs_follows_a_running_job_to_its_end(live: Live) -> None:
    result = live.cli("logs", live.jobs["talk"], "-f")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"step-{i}" for i in range(1, 9)]
    assert live.client.workload(live.jobs["talk"])["phase"] == "succeeded"
    tail = live.cli("logs", live.jobs["talk"], "--bytes", "7")
    assert tail.stdout == "step-8\n"
    missing = live.cli("logs", live.jobs["waits"])
    assert missing.returncode == 1
    assert "has not run" in missing.stderr


def test_top_draws_the_fleet_the_teams_and_the_queue(live: Live) -> None:
    result = live.cli("top", "--once")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "H100" in out and "2/2 in use" in out
    assert "eu-1" in out and "us-1" in out
    queue = out[out.index("POS") :]
    assert live.jobs["waits"] in queue and "waiter" in queue


def test_usage_by_spoke_as_csv_adds_up(live: Live) -> None:
    wait_for(lambda: live.client.workload(live.jobs["talk"])["phase"] == "succeeded")
    result = live.cli("usage", "--by", "spoke", "--since", "1h", "--csv")
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    by = {r["spoke"]: r for r in rows}
    assert set(by) == {"eu-1", "us-1", "TOTAL"}
    total = sum(float(by[s]["gpu_h_on_prem"]) for s in ("eu-1", "us-1"))
    assert float(by["TOTAL"]["gpu_h_on_prem"]) == pytest.approx(total, abs=2e-3)
    assert float(by["us-1"]["gpu_h_on_prem"]) > 0
    report = json.loads(live.cli("usage", "--by", "team", "--json").stdout)
    assert set(report["rows"]) == {"vision", "nlp"}
    bad = live.cli("usage", "--since", "yesterday-ish")
    assert bad.returncode == 2 and "cannot read the time" in bad.stderr
