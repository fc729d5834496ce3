"""What an operator sees of a running federation: /metrics, queue positions, logs, usage."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpufed.cli import main
from schemas import Phase
from schemas.burst import InstanceState
from tests.integration.fed import InProcessFederation, nodes
from tests.support.instances import publish_instance
from tests.support.wait import wait_until as until


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    parsed: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return parsed.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_follow_the_queue_the_gpus_and_the_placements(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    assert fed.api is not None
    holder = await fed.submit(
        name="holder", team="vision", gpus_per_node=2, command=["sleep", "30"]
    )
    await fed.wait_phase(holder, {Phase.RUNNING})
    waiting = [
        await fed.submit(name=f"w{i}", team="nlp", gpus_per_node=1, command=["true"])
        for i in range(3)
    ]

    async def metrics() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        assert fed.api is not None
        response = await fed.api.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/plain")
        return samples(response.text)

    hub = fed.hub
    assert hub is not None
    await until(lambda: all(w in hub.positions for w in waiting))
    # GPUs per spoke are what the spoke last reported: wait for the report after the placement.
    await until(lambda: not hub.reports["eu-1"].nodes[0].free_devices)
    parsed = await metrics()
    queued = sum(
        v
        for (name, labels), v in parsed.items()
        if name == "gpufed_queue_workloads" and ("team", "nlp") in labels
    )
    assert queued == 3
    assert value(parsed, "gpufed_gpus_capacity", spoke="eu-1", gpu_model="H100") == 2
    assert value(parsed, "gpufed_gpus_allocated", spoke="eu-1", gpu_model="H100") == 2
    assert value(parsed, "gpufed_gpus_free", spoke="eu-1", gpu_model="H100") == 0
    assert value(parsed, "gpufed_placements_total") == 1
    assert value(parsed, "gpufed_spoke_lease", spoke="eu-1", state="ready") == 1
    assert value(parsed, "gpufed_team_gpus_allocated", team="vision", gpu_model="H100") == 2
    assert value(parsed, "gpufed_queue_wait_seconds_count", priority_class="batch") == 1
    assert value(parsed, "gpufed_cycle_duration_seconds_count") > 0

    # Positions: the oldest of one team's equal jobs goes first.
    listed = {w["id"]: w for w in (await fed.api.get("/v1/workloads")).json()}
    assert [listed[w]["position"] for w in waiting] == [1, 2, 3]
    assert listed[holder]["position"] is None

    await fed.api.delete(f"/v1/workloads/{holder}")
    for w in waiting:
        await fed.wait_phase(w, {Phase.SUCCEEDED})
    parsed = await metrics()
    assert value(parsed, "gpufed_placements_total") == 4
    assert value(parsed, "gpufed_queue_workloads", team="nlp", priority_class="batch") == 0
    assert value(parsed, "gpufed_queue_wait_seconds_count", priority_class="batch") == 4


async def test_a_forged_capacity_report_is_dropped_and_counted(
    fed: InProcessFederation,
) -> None:
    hub = await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    report = fed.spokes["eu-1"].report().model_copy(update={"spoke_id": "eu-2"})
    await hub.bus.nc.publish("gpufed.v1.spoke.eu-1.capacity", report.model_dump_json().encode())
    await hub.bus.nc.publish("gpufed.v1.spoke.eu-1.capacity", b"{not json")
    await until(lambda: hub.counters["malformed"] >= 2)
    assert fed.api is not None
    parsed = samples((await fed.api.get("/metrics")).text)
    assert value(parsed, "gpufed_messages_dropped_total", reason="forged") == 1
    assert value(parsed, "gpufed_messages_dropped_total", reason="malformed") == 1
    assert "eu-2" not in hub.spokes


async def test_the_log_tail_comes_from_the_spoke_and_follows(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    assert fed.api is not None
    gate = tmp_path / "go"
    script = (
        "for i in $(seq 1 2000); do echo line-$i; done; "
        f"while [ ! -e {gate} ]; do sleep 0.05; done; echo after-gate"
    )
    wid = await fed.submit(name="talk", team="vision", command=["sh", "-c", script])
    await fed.wait_phase(wid, {Phase.RUNNING})

    async def log(**params: int) -> dict[str, object]:
        assert fed.api is not None
        response = await fed.api.get(f"/v1/workloads/{wid}/log", params=params)
        assert response.status_code == 200, response.text
        return dict(response.json())

    await until(lambda: (fed.root / "spokes/eu-1/logs" / f"{wid}-e1.log").exists())
    tail: dict[str, object] = {}
    for _ in range(200):
        tail = await log(max_bytes=100)
        if "line-2000" in str(tail["data"]):
            break
    assert str(tail["data"]).endswith("line-2000\n")
    assert len(str(tail["data"])) == 100  # bounded by what was asked
    whole = await log(offset=0, max_bytes=1_000_000 // 10)
    assert str(whole["data"]).startswith("line-1\n")
    gate.touch()
    await fed.wait_phase(wid, {Phase.SUCCEEDED})
    more = await log(offset=int(str(tail["next_offset"])))
    assert more["data"] == "after-gate\n"
    assert more["phase"] == "succeeded"

    too_big = await fed.api.get(f"/v1/workloads/{wid}/log", params={"max_bytes": 10**7})
    assert too_big.status_code == 422
    queued = await fed.submit(name="never", team="vision", gpus_per_node=8, command=["true"])
    refused = await fed.api.get(f"/v1/workloads/{queued}/log")
    assert refused.status_code == 409
    assert "not run" in refused.json()["message"]

    await fed.stop("eu-1")  # its spoke gone (a cloud spoke given back, say)
    gone = await fed.api.get(f"/v1/workloads/{wid}/log")
    assert gone.status_code == 503
    assert gone.json()["message"].startswith(f"spoke eu-1, which ran {wid}, is not connected now")


async def test_a_cloud_spoke_given_back_leaves_the_fleet_view_once_lost(
    fed: InProcessFederation,
) -> None:
    """An on-prem spoke that goes silent stays listed as lost (and alerts); a cloud spoke
    whose instance burst gave back leaves /v1/spokes and the per-spoke metrics once the hub
    has declared it lost, so the spoke-lost alert does not fire for ever after every burst."""
    hub = await fed.start_hub(suspect_after_s=0.5, lost_after_s=1.0)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"), heartbeat_s=0.1)
    await fed.start_spoke("burst-t1", "us", nodes("burst-t1", 1, 2, "L4"), heartbeat_s=0.1)
    # One spoke stays: a hub that hears nobody takes itself for the one cut off.
    await fed.start_spoke("us-1", "us", nodes("us-1", 1, 2, "L4"), heartbeat_s=0.1)
    await fed.wait_spokes(3)
    now = time.time()
    for i, state in enumerate((InstanceState.RUNNING, InstanceState.TERMINATED)):
        await publish_instance(hub.bus, "burst-t1", state, now + i)
    await until(lambda: hub.instances.get("burst-t1", None) is not None)
    await until(lambda: hub.instances["burst-t1"].state is InstanceState.TERMINATED)
    assert fed.api is not None
    listed = {s["id"] for s in (await fed.api.get("/v1/spokes")).json()}
    assert listed == {"eu-1", "burst-t1", "us-1"}  # still heard from: shown until lost

    await fed.stop("eu-1")
    await fed.stop("burst-t1")
    gone = ("eu-1", "burst-t1")
    await until(lambda: all(hub.spokes[s].lost_at is not None for s in gone), timeout=15)
    spokes = {s["id"]: s for s in (await fed.api.get("/v1/spokes")).json()}
    assert {sid: s["status"] for sid, s in spokes.items()} == {"eu-1": "lost", "us-1": "ready"}
    # A lost spoke's GPUs are not on offer, whatever its last report said.
    assert spokes["eu-1"]["gpus"] == {"H100": {"total": 2, "free": 0}}
    assert spokes["us-1"]["gpus"] == {"L4": {"total": 2, "free": 2}}
    parsed = samples((await fed.api.get("/metrics")).text)
    assert value(parsed, "gpufed_spoke_lease", spoke="eu-1", state="lost") == 1
    assert not [labels for (name, labels) in parsed if ("spoke", "burst-t1") in labels]
    assert (await fed.api.get("/v1/health")).json()["spokes"] == 2  # the ones listed
    assert "burst-t1" in hub.spokes  # its record stays: usage by spoke still names it


async def test_work_a_cloud_instance_starts_for_says_so_until_it_is_placed(
    fed: InProcessFederation, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpufed jobs` and `explain` of work no on-prem spoke can take say that an instance is
    being rented for it (it waits for a boot, not for on-prem devices), until it is placed."""
    hub = await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "L4"))
    await fed.wait_spokes(1)
    wid = await fed.submit(name="big", team="vision", gpu_models=["H100"], command=["true"])
    await fed.wait_phase(wid, {Phase.QUEUED})
    asked = time.time() - 40
    fields = {"instance_type": "p5.48xlarge", "gpu_model": "H100", "gpu_count": 8}
    await publish_instance(
        hub.bus, "burst-t1", InstanceState.REQUESTED, asked, workload_ids=(wid,), **fields
    )
    await until(lambda: "burst-t1" in hub.instances)
    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["jobs"]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if wid in line)
        said = re.search(
            r"; cloud instance burst-t1 \(p5.48xlarge, 8 H100\), asked for (\d+) s ago$", row
        )
        assert said is not None and 40 <= int(said[1]) < 100, row  # 40 s, and the test's own
        assert await asyncio.to_thread(main, ["explain", wid]) == 0
        out = capsys.readouterr().out
        assert re.search(r"  cloud:  burst-t1 \(p5.48xlarge, 8 H100\), asked for \d+ s ago", out)
    await publish_instance(hub.bus, "burst-t1", InstanceState.RUNNING, asked + 30, **fields)
    await until(lambda: hub.instances["burst-t1"].state is InstanceState.RUNNING)
    assert fed.api is not None
    assert (await fed.api.get(f"/v1/workloads/{wid}")).json()["cloud_instance"] is None


async def test_logs_follow_of_queued_work_waits_for_it_to_start(
    fed: InProcessFederation,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpufed logs -f` just after `submit` (the job still queued) waits for it to start,
    saying once why it waits, then follows it; one that ends without running says so."""
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.wait_spokes(1)
    gate = tmp_path / "go"
    hold = await fed.submit(
        name="hold",
        team="vision",
        command=["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"],
    )
    await fed.wait_phase(hold, {Phase.RUNNING})
    wid = await fed.submit(name="next", team="vision", command=["sh", "-c", "echo started"])
    never = await fed.submit(name="never", team="vision", gpus_per_node=8, command=["true"])
    captured: list[tuple[str, str]] = []

    def said(text: str) -> bool:
        captured.append(capsys.readouterr())
        return any(text in err for _, err in captured)

    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        follow = asyncio.create_task(asyncio.to_thread(main, ["logs", wid, "-f"]))
        await until(lambda: said(f"gpufed logs: {wid} is queued ("))
        gate.touch()
        assert await follow == 0
        said("")
        out = "".join(o for o, _ in captured)
        err = "".join(e for _, e in captured)
        assert out == "started\n"
        assert err.count("waiting for it to start (Ctrl-C to stop)") == 1, err

        captured.clear()
        cancelled = asyncio.create_task(asyncio.to_thread(main, ["logs", never, "-f"]))
        await until(lambda: said(f"gpufed logs: {never} is queued ("))
        assert await asyncio.to_thread(main, ["cancel", never]) == 0
        assert await cancelled == 1
        said("")
        assert f"gpufed logs: {never} cancelled without running\n" in "".join(
            e for _, e in captured
        )
