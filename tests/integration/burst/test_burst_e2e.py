"""Cloud burst end to end: hub, on-prem spoke and `gpufed burst --provider local` as processes.

On-prem is full → the hub reports demand → burst launches a cloud spoke → the hub places the
waiting work there → it runs → the idle cloud spoke is released after idle_ttl.
"""

from __future__ import annotations

import asyncio
import json
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from burst.catalog import load_catalog
from burst.providers.local import STATE_FILE, LocalProvider
from bus.processes import stop_process
from gpufed.cli import main
from gpufed.client import HubClient
from gpufed.up import Federation, SimSpoke
from hub.core.spend import month_start
from tests.integration.burst.hub_role import process_gone
from tests.support.wait import wait_until_sync

IDLE_TTL_S = 2.0
CATALOG = {
    "as_of": "2025-01-15",
    "source": "tests",
    "instance_types": [
        {
            "name": "sim.l4x2",
            "gpu_model": "L4",
            "gpu_count": 2,
            "gpu_memory_gib": 24,
            "vcpus": 8,
            "prices": {"us-east-1": {"on_demand": 1.6}},
        }
    ],
}


class Burst:
    """The federation plus a `gpufed burst` process, each stopped by its own handle."""

    def __init__(self, root: Path) -> None:
        self.fed = Federation(root, 0, (SimSpoke("dc-1", "us", nodes=1, gpus=1, model="L4"),))
        self.state_dir = self.fed.data_dir / "burst"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: HubClient | None = None

    def start(self) -> None:
        self.fed.start()
        catalog = self.fed.data_dir / "catalog.yaml"
        catalog.write_text(yaml.safe_dump(CATALOG))
        command = [
            sys.executable, "-m", "gpufed", "burst",
            "--provider", "local",
            "--nats-url", self.fed.nats.url,
            *self.fed.burst_nats_args(),
            "--catalog", str(catalog),
            "--state-dir", str(self.state_dir),
            "--tick", "0.3",
            "--burst-after", "0.5",
            "--idle-ttl", str(IDLE_TTL_S),
            "--cooldown", "1",
            "--reconcile-every", "1",
            "--spoke-heartbeat", "0.5",
        ]  # fmt: skip
        with open(self.fed.log_dir / "burst.log", "ab") as log:
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.client = self.fed.client()
        burst_log = self.fed.log_dir / "burst.log"
        self.until(lambda: "burst_ready" in burst_log.read_text(), 30, "the burst controller")

    def instances(self) -> list[dict[str, Any]]:
        reply = httpx.get(
            f"{self.fed.api_url}/v1/burst/instances",
            timeout=5,
            headers={"Authorization": f"Bearer {self.fed.admin_token}"},
        )
        reply.raise_for_status()
        return reply.json()  # type: ignore[no-any-return]

    def until(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """`predicate` holds within `timeout_s`, and the controller stays up meanwhile."""

        def held() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (
                f"burst exited; see {self.fed.log_dir / 'burst.log'}"
            )
            return predicate()

        wait_until_sync(held, timeout_s, what)

    def stop(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.proc is not None:
            stop_process(self.proc, 20)
        state = self.state_dir / STATE_FILE
        if state.exists():  # cloud spokes outlive the controller on purpose: stop them here
            ids = list(json.loads(state.read_text())["instances"])
            provider = LocalProvider(self.state_dir, self.fed.nats.url, load_catalog())
            asyncio.run(provider.terminate(ids))
        self.fed.stop()


@pytest.fixture
def burst(tmp_path: Path) -> Iterator[Burst]:
    running = Burst(tmp_path)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def test_work_bursts_to_a_cloud_spoke_that_is_released_when_idle(burst: Burst) -> None:
    client = burst.client
    assert client is not None
    # Each job holds its GPU until the gate opens, so the on-prem GPU stays busy however long
    # the cloud spoke takes to boot (a fixed sleep raced a slow boot on a loaded machine).
    gate = burst.state_dir / "gate"
    hold = f"while [ ! -e {gate} ]; do sleep 0.1; done"
    spec = {"team": "ml", "gpu_models": ["L4"], "command": ["sh", "-c", hold]}
    ids = [client.submit({**spec, "name": f"job-{n}"})["id"] for n in range(3)]

    def cloud_spokes() -> list[dict[str, Any]]:
        return [s for s in client.spokes() if s.get("kind") == "cloud"]

    burst.until(lambda: bool(cloud_spokes()), 30, "a cloud spoke to join")
    [cloud] = cloud_spokes()
    burst.until(
        lambda: any(client.workload(w)["spoke_id"] == cloud["id"] for w in ids),
        30,
        "work placed on the cloud spoke",
    )
    gate.touch()
    burst.until(
        lambda: all(client.workload(w)["phase"] == "succeeded" for w in ids), 60, "all jobs done"
    )
    placed = {client.workload(w)["spoke_id"] for w in ids}
    assert placed == {"dc-1", cloud["id"]}  # on-prem first, the rest on the cloud spoke

    def states() -> dict[str, str]:
        return {i["burst_id"]: i["state"] for i in burst.instances()}

    burst.until(lambda: states().get(cloud["id"]) == "terminated", 30, "idle release")
    assert list(states()) == [cloud["id"]]  # one instance, launched once
    [instance] = burst.instances()
    assert instance["instance_type"] == "sim.l4x2"
    assert process_gone(int(instance["provider_instance_id"].removeprefix("pid-")), cloud["id"])
    # Its NATS credential ended with it: the server refuses it from then on.
    creds = burst.state_dir / "creds" / f"{cloud['id']}.creds"
    assert stat.S_IMODE(creds.stat().st_mode) == 0o600
    burst.until(lambda: not can_connect(burst.fed.nats.url, creds), 10, "the credential revoked")

    # What the instance cost is one figure everywhere: its bill, the team's usage row, the
    # month's spend the budget is checked against, and the metric.
    usage = client.usage(since=month_start(time.time()))
    [bill] = usage["instances"]
    assert (bill["burst_id"], bill["team"]) == (cloud["id"], "ml")
    assert bill["ended_at"] is not None and bill["cost"] > 0
    row = usage["rows"]["ml"]
    assert row["cloud_cost"] == pytest.approx(bill["cost"], abs=1e-6)
    assert row["burst_spend_month"] == pytest.approx(bill["cost"], abs=1e-6)
    assert usage["totals"]["cloud_cost"] == pytest.approx(bill["cost"], abs=1e-6)
    assert cloud_spend_metric(burst.fed.api_url) == pytest.approx({"ml": bill["cost"]}, abs=1e-6)


def test_work_no_catalog_offer_fits_says_why_no_cloud_instance_comes(
    burst: Burst, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Work that neither on-prem nor the catalog (L4 only) can serve: `gpufed explain`, `jobs`
    and the API say why burst rents nothing for it, in the controller's words."""
    client = burst.client
    assert client is not None
    spec = {"name": "big", "team": "ml", "gpu_models": ["H100"], "command": ["true"]}
    wid = client.submit(spec)["id"]
    said = "no catalog offer fits 1x1 H100 GPUs in an allowed region [no_offer]"
    burst.until(lambda: client.workload(wid)["cloud_refused"] == said, 30, "burst's verdict")
    monkeypatch.setenv("GPUFED_API", burst.fed.api_url)
    monkeypatch.setenv("GPUFED_TOKEN", burst.fed.admin_token)
    capsys.readouterr()
    assert main(["explain", wid]) == 0
    assert f"  cloud:  none rented: {said}\n" in capsys.readouterr().out
    assert main(["jobs"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if wid in line)
    assert row.endswith(f"; no cloud instance: {said}"), row
    assert burst.instances() == []  # and it rented nothing


def cloud_spend_metric(api_url: str) -> dict[str, float]:
    """gpufed_cloud_spend_dollars_total per team, as Prometheus scrapes it."""
    text = httpx.get(f"{api_url}/metrics", timeout=5).text
    return {
        sample.labels["team"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "gpufed_cloud_spend_dollars_total"
    }


def can_connect(url: str, creds: Path) -> bool:
    """Whether a client with this creds file gets in (a refusal is an auth error at once)."""

    async def attempt() -> bool:
        try:
            nc = await nats.connect(
                url, user_credentials=str(creds), allow_reconnect=False, connect_timeout=2
            )
        except nats.errors.Error:
            return False
        await nc.close()
        return True

    return asyncio.run(attempt())
