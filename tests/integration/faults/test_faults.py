"""Fault drills with real processes: kill -9 the hub or a spoke, bounce NATS, cut a spoke off.

Each workload appends "<workload id> <node>" to one file when it starts: the workloads' own
record of how often, and where, each one really ran.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from bus.client import Bus
from gpufed.up import Federation, SimSpoke
from schemas import SubmitReply, subjects
from tests.integration.conftest import MakeClient, MakeFederation
from tests.integration.proxy import CuttableProxy
from tests.support.api import wait_http, wait_terminal


def job(log: Path, name: str, secs: float, **extra: Any) -> dict[str, Any]:
    script = f'echo "$GPUFED_WORKLOAD_ID $GPUFED_NODE" >> {log}; sleep {secs}'
    return {"name": name, "team": "drill", "command": ["sh", "-c", script], **extra}


def runs(log: Path) -> list[tuple[str, str]]:
    if not log.exists():
        return []
    return [tuple(line.split()) for line in log.read_text().splitlines()]  # type: ignore[misc]


async def start_all(
    make_fed: MakeFederation, api: MakeClient, fleet: tuple[SimSpoke, ...]
) -> tuple[Federation, httpx.AsyncClient]:
    """A federation with every spoke of `fleet` up, and a REST client of its hub."""
    fed: Federation = make_fed(fleet)
    fed.start_hub()
    for spoke in fleet:
        fed.start_spoke(spoke)
    client = api(fed)
    await wait_http(client, {s.id for s in fleet})
    return fed, client


async def submit_retrying(bus: Bus, spec: dict[str, Any], attempts: int = 200) -> str | None:
    """Submit over NATS; retry while the hub is down. None if it never accepted."""
    payload = json.dumps(spec).encode()
    for _ in range(attempts):
        try:
            msg = await bus.nc.request(subjects.SUBMIT, payload, timeout=1)
        except Exception:  # no responders / timeout while the hub is down
            await asyncio.sleep(0.1)
            continue
        reply = SubmitReply.model_validate_json(msg.data)
        assert reply.ok, reply.error
        return reply.workload_id
    return None


async def test_hub_killed_mid_run_loses_nothing_and_runs_nothing_twice(
    make_fed: MakeFederation, api: MakeClient, tmp_path: Path
) -> None:
    fleet = (
        SimSpoke("eu-1", "eu", nodes=2, gpus=8, model="H100"),
        SimSpoke("us-1", "us", nodes=2, gpus=8, model="L4"),
    )
    fed, client = await start_all(make_fed, api, fleet)
    bus = Bus(fed.client_settings("drill"))
    await bus.connect()
    log = tmp_path / "runs.log"
    accepted: list[str] = []

    async def submitter() -> None:
        for i in range(500):
            wid = await submit_retrying(bus, job(log, f"j{i}", 0.2))
            if wid is not None:
                accepted.append(wid)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(submitter())
    while len(accepted) < 150:
        await asyncio.sleep(0.05)
    fed.kill("hub")  # kill -9 mid-stream: submissions, placements and events in flight
    await asyncio.sleep(1.0)
    fed.start_hub()
    await task
    await bus.close()
    assert len(accepted) == 500
    records = await wait_terminal(client, set(accepted), timeout=180)
    assert {r["phase"] for r in records.values()} == {"succeeded"}
    counts = Counter(wid for wid, _node in runs(log))
    assert all(counts[w] == 1 for w in accepted), {w: counts[w] for w in accepted if counts[w] != 1}
    assert max(counts.values()) == 1  # not even an unacknowledged submission ran twice


async def test_dead_spoke_work_reruns_elsewhere_once_and_is_not_resumed(
    make_fed: MakeFederation, api: MakeClient, tmp_path: Path
) -> None:
    fleet = (
        SimSpoke("eu-1", "eu", nodes=1, gpus=4, model="H100"),
        SimSpoke("eu-2", "eu", nodes=1, gpus=4, model="H100"),
    )
    fed: Federation = make_fed(
        fleet, hub_args=("--suspect-after", "2.5", "--lost-after", "4"), spoke_args=()
    )
    fed.start_hub()
    fed.start_spoke(fed.spoke("eu-1"))
    client = api(fed)
    await wait_http(client, {"eu-1"})
    log = tmp_path / "runs.log"
    release = tmp_path / "release"  # the workloads run until it exists: none ends too early
    ids = []
    for i in range(4):
        spec = job(log, f"long-{i}", 1, restart_policy="on_failure")
        spec["command"][-1] = spec["command"][-1].replace(
            "; sleep", f"; while [ ! -e {release} ]; do sleep 0.1; done; sleep"
        )
        response = await client.post("/v1/workloads", json=spec)
        ids.append(response.json()["id"])
    while len(runs(log)) < 4:
        await asyncio.sleep(0.05)
    fed.start_spoke(fed.spoke("eu-2"))
    await wait_http(client, {"eu-1", "eu-2"})
    fed.kill("eu-1")  # its workloads' processes run on, orphaned
    release.touch()
    records = await wait_terminal(client, set(ids), timeout=60)
    assert {r["phase"] for r in records.values()} == {"succeeded"}
    assert {r["spoke_id"] for r in records.values()} == {"eu-2"}
    on_eu2 = Counter(w for w, node in runs(log) if node.startswith("eu-2"))
    assert all(on_eu2[w] == 1 for w in ids)
    # The dead spoke comes back with its old state: it must stop, not resume, the moved work.
    fed.start_spoke(fed.spoke("eu-1"))
    await wait_http(client, {"eu-1", "eu-2"})
    await asyncio.sleep(2.0)
    spokes = {s["id"]: s for s in (await client.get("/v1/spokes")).json()}
    assert spokes["eu-1"]["running"] == 0
    on_eu1 = Counter(w for w, node in runs(log) if node.startswith("eu-1"))
    assert all(on_eu1[w] == 1 for w in ids)  # the original start only, never a second
    final = {r["id"]: r for r in (await client.get("/v1/workloads")).json()}
    assert {final[w]["phase"] for w in ids} == {"succeeded"}


async def test_nats_restart_mid_run_loses_nothing(
    make_fed: MakeFederation, api: MakeClient, tmp_path: Path
) -> None:
    fleet = (
        SimSpoke("eu-1", "eu", nodes=2, gpus=4, model="H100"),
        SimSpoke("us-1", "us", nodes=2, gpus=4, model="L4"),
    )
    fed, client = await start_all(make_fed, api, fleet)
    log = tmp_path / "runs.log"
    ids = []
    for i in range(60):
        response = await client.post("/v1/workloads", json=job(log, f"j{i}", 0.5 + (i % 3)))
        ids.append(response.json()["id"])
    await asyncio.sleep(1.5)
    fed.nats.stop()  # stopped by its own handle; same port and data dir when it comes back
    await asyncio.sleep(3.0)
    fed.nats.start()
    records = await wait_terminal(client, set(ids), timeout=120)
    assert {r["phase"] for r in records.values()} == {"succeeded"}
    counts = Counter(w for w, _ in runs(log))
    assert all(counts[w] == 1 for w in ids)


async def test_spoke_cut_off_briefly_keeps_its_work(
    make_fed: MakeFederation, api: MakeClient, tmp_path: Path
) -> None:
    fleet = (
        SimSpoke("eu-1", "eu", nodes=1, gpus=4, model="H100"),
        SimSpoke("us-1", "us", nodes=1, gpus=4, model="H100"),
    )
    fed: Federation = make_fed(
        fleet, hub_args=("--suspect-after", "2.5", "--lost-after", "30"), spoke_args=()
    )
    proxy = CuttableProxy("127.0.0.1", fed.nats.port)
    await proxy.start()
    try:
        fed.start_hub()
        fed.start_spoke(fed.spoke("eu-1"), nats_url=proxy.url)
        client = api(fed)
        await wait_http(client, {"eu-1"})
        log = tmp_path / "runs.log"
        ids = []
        for i in range(4):
            response = await client.post("/v1/workloads", json=job(log, f"cut-{i}", 3))
            ids.append(response.json()["id"])
        while len(runs(log)) < 4:
            await asyncio.sleep(0.05)
        fed.start_spoke(fed.spoke("us-1"))
        await wait_http(client, {"us-1"})
        await proxy.cut()
        await asyncio.sleep(3.5)
        spokes = {s["id"]: s for s in (await client.get("/v1/spokes")).json()}
        assert spokes["eu-1"]["status"] == "suspect"
        # New work goes to the spoke that is still there.
        late = (await client.post("/v1/workloads", json=job(log, "late", 0.1))).json()["id"]
        await asyncio.sleep(1.0)  # the cut spoke's work ends while it is away
        await proxy.restore()
        records = await wait_terminal(client, {*ids, late}, timeout=60)
    finally:
        await proxy.close()
    assert {r["phase"] for r in records.values()} == {"succeeded"}
    assert {records[w]["spoke_id"] for w in ids} == {"eu-1"}
    assert records[late]["spoke_id"] == "us-1"
    counts = Counter(w for w, _ in runs(log))
    assert all(counts[w] == 1 for w in [*ids, late])


async def test_restarted_spoke_readopts_its_work_and_reports_its_end_once(
    make_fed: MakeFederation, api: MakeClient, tmp_path: Path
) -> None:
    fleet = (SimSpoke("eu-1", "eu", nodes=1, gpus=4, model="H100"),)
    fed: Federation = make_fed(fleet, hub_args=("--lost-after", "60"), spoke_args=())
    fed.start_hub()
    fed.start_spoke(fed.spoke("eu-1"))
    client = api(fed)
    await wait_http(client, {"eu-1"})
    log = tmp_path / "runs.log"
    ids = []
    for i, code in enumerate([0, 0, 3]):
        spec = job(log, f"adopt-{i}", 3)
        spec["command"][-1] += f"; exit {code}"
        ids.append((await client.post("/v1/workloads", json=spec)).json()["id"])
    while len(runs(log)) < 3:
        await asyncio.sleep(0.05)
    fed.kill("eu-1")  # the agent dies; its workloads' processes run on
    await asyncio.sleep(0.5)
    fed.start_spoke(fed.spoke("eu-1"))  # same state dir: re-adopts them
    records = await wait_terminal(client, set(ids), timeout=60)
    assert [records[w]["phase"] for w in ids] == ["succeeded", "succeeded", "failed"]
    assert records[ids[2]]["exit_code"] == 3  # learnt from the exit log after adoption
    assert {records[w]["epoch"] for w in ids} == {1}  # never moved, never restarted
    assert Counter(w for w, _ in runs(log)) == dict.fromkeys(ids, 1)


# Each run appends "start <ns> <id> <node>" and, when it ends or is stopped, "end <ns> <id>".
TIMED = (
    "trap 'echo \"end $(date +%s%N) $GPUFED_WORKLOAD_ID\" >> {log}; exit 143' TERM; "
    'echo "start $(date +%s%N) $GPUFED_WORKLOAD_ID $GPUFED_NODE" >> {log}; '
    "sleep {secs} & wait $!; "
    'echo "end $(date +%s%N) $GPUFED_WORKLOAD_ID" >> {log}'
)


def intervals(log: Path) -> dict[str, list[tuple[int, int | None, str]]]:
    """Per workload, its runs as (start ns, end ns or None while running, node)."""
    runs_of: dict[str, list[tuple[int, int | None, str]]] = {}
    for line in log.read_text().splitlines():
        what, t, wid, *node = line.split()
        mine = runs_of.setdefault(wid, [])
        if what == "start":
            mine.append((int(t), None, node[0]))
        else:
            i = max(i for i, run in enumerate(mine) if run[1] is None)
            mine[i] = (mine[i][0], int(t), mine[i][2])
    return runs_of


def overlapping(runs_of: dict[str, list[tuple[int, int | None, str]]]) -> list[str]:
    """Workloads two of whose runs were alive at the same time (an unended run never ends)."""
    bad = []
    for wid, mine in runs_of.items():
        ordered = sorted(mine)
        for (_, end, _), (next_start, _, _) in itertools.pairwise(ordered):
            if end is None or end > next_start:
                bad.append(wid)
                break
    return bad


async def test_spoke_cut_off_past_lost_after_stops_movable_work_before_it_runs_elsewhere(
    make_fed: Any, api: Any, tmp_path: Path
) -> None:
    fleet = (
        SimSpoke("eu-1", "eu", nodes=1, gpus=4, model="H100"),
        SimSpoke("eu-2", "eu", nodes=1, gpus=4, model="H100"),
    )
    fed: Federation = make_fed(
        fleet,
        hub_args=("--suspect-after", "2.5", "--lost-after", "9"),
        spoke_args=("--stop-grace", "1"),  # fence_after = 9 - 1 - 3 heartbeats = 5 s
    )
    proxy = CuttableProxy("127.0.0.1", fed.nats.port)
    await proxy.start()
    try:
        fed.start_hub()
        fed.start_spoke(fed.spoke("eu-1"), nats_url=proxy.url)
        client = api(fed)
        await wait_http(client, {"eu-1"})
        log = tmp_path / "timed.log"
        movable, kept = [], []
        for i in range(3):
            spec = {
                "name": f"move-{i}",
                "team": "drill",
                "command": ["sh", "-c", TIMED.format(log=log, secs=20)],
                "restart_policy": "on_failure",
            }
            movable.append((await client.post("/v1/workloads", json=spec)).json()["id"])
        spec = {
            "name": "keep",
            "team": "drill",
            "command": ["sh", "-c", TIMED.format(log=log, secs=20)],
            "restart_policy": "on_failure",
            "on_hub_loss": "keep",
        }
        kept.append((await client.post("/v1/workloads", json=spec)).json()["id"])
        while len(log.read_text().splitlines() if log.exists() else []) < 4:
            await asyncio.sleep(0.05)
        fed.start_spoke(fed.spoke("eu-2"))
        await wait_http(client, {"eu-1", "eu-2"})
        await proxy.cut()
        # Past lost_after: the hub moves the movable work to eu-2...
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            listed = {r["id"]: r for r in (await client.get("/v1/workloads")).json()}
            if all(listed[w]["spoke_id"] == "eu-2" for w in movable):
                break
            assert asyncio.get_running_loop().time() < deadline, "never moved"
            await asyncio.sleep(0.2)
        await asyncio.sleep(2.0)
        await proxy.restore()
        records = await wait_terminal(client, {*movable, *kept}, timeout=90)
    finally:
        await proxy.close()
    assert {r["phase"] for r in records.values()} == {"succeeded"}
    runs_of = intervals(log)
    assert overlapping(runs_of) == []
    for w in movable:
        # ...after eu-1 had stopped it: one stopped run there, one whole run on eu-2.
        assert [node.split("-n")[0] for _, _, node in sorted(runs_of[w])] == ["eu-1", "eu-2"]
    assert [node.split("-n")[0] for _, _, node in runs_of[kept[0]]] == ["eu-1"]
    assert records[kept[0]]["spoke_id"] == "eu-1"
