"""An operator takes a spoke out of placement for maintenance (`gpufed cordon`): no new work
goes there while what runs there runs on, its idle GPUs are not on offer, the cordon outlives
a hub restart, and only an admin may set it (audited). `gpufed uncordon` puts it back."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from gpufed.cli import main
from hub import cordons
from hub.records import Cordon
from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.integration.test_observability import samples, value
from tests.support.wait import wait_until as until


async def test_a_cordoned_spoke_gets_no_new_work_until_it_is_uncordoned(
    fed: InProcessFederation,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    gate = tmp_path / "go"
    hold = ["sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done"]
    before = await fed.submit(name="before", team="vision", command=hold)
    await fed.wait_phase(before, {Phase.RUNNING})

    async def gpufed(*argv: str) -> tuple[int, str]:
        code = await asyncio.to_thread(main, list(argv))
        return code, capsys.readouterr().out

    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        assert await gpufed("cordon", "eu-1", "--reason", "firmware update") == (
            0,
            "spoke eu-1 cordoned: no new work goes there; 1 running workload(s) run on "
            "(gpufed uncordon to put it back)\n",
        )
        after = await fed.submit(name="after", team="vision", command=["true"])
        # Placement has looked at it, and left it waiting though eu-1 has a free H100.
        await until(lambda: _looked_at(fed, after), 10, "a cycle to leave it queued")
        queued = await fed.workload(after)
        assert queued["phase"] == "queued" and queued["spoke_id"] is None
        assert (await fed.workload(before))["phase"] == "running"  # runs on
        code, out = await gpufed("spokes")
        [row] = [line.split() for line in out.splitlines() if " H100 " in line]
        assert code == 0 and row[3:6] == ["ready,", "cordoned", "1"] and "0/2" in row
        assert "eu-1 cordoned by admin " in out and out.rstrip().endswith(": firmware update")
        code, out = await gpufed("top", "--once")
        [row] = [line.split() for line in out.splitlines() if line.split()[:1] == ["eu-1"]]
        assert code == 0 and row[1:4] == ["eu", "ready,", "cordoned"], out
        assert "in use" not in out  # its GPUs are out of the pool the bars show

        assert fed.api is not None
        parsed = samples((await fed.api.get("/metrics")).text)
        free = value(parsed, "gpufed_gpus_free", spoke="eu-1", gpu_model="H100")
        assert (free, value(parsed, "gpufed_gpus_capacity", spoke="eu-1", gpu_model="H100")) == (
            0.0,
            2.0,
        )

        # A member may not, and the refusal is audited; an unknown spoke is a 404.
        member = fed.client(await fed.token("alice", "member", "vision"))
        refused = await member.delete("/v1/spokes/eu-1/cordon")
        assert refused.status_code == 403 and "needs admin" in refused.json()["message"]
        await member.aclose()
        missing = await fed.api.put("/v1/spokes/eu-9/cordon", json={})
        assert missing.status_code == 404
        audit = (await fed.api.get("/v1/audit", params={"action": "spoke.uncordon"})).json()
        assert [(e["actor"], e["result"]) for e in audit] == [("alice", "denied")]

    # The cordon is the store's: a restarted hub keeps it.
    await fed.stop("hub")
    await fed.start_hub()
    await fed.wait_spokes(1)
    assert fed.api is not None
    [spoke] = (await fed.api.get("/v1/spokes")).json()
    assert spoke["cordoned"]["reason"] == "firmware update"
    assert (await fed.workload(after))["phase"] == "queued"

    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        assert await gpufed("uncordon", "eu-1") == (0, "spoke eu-1 back in placement\n")
    await fed.wait_phase(after, {Phase.SUCCEEDED})
    gate.touch()
    await fed.wait_phase(before, {Phase.SUCCEEDED})
    audit = (await fed.api.get("/v1/audit", params={"action": "spoke.cordon"})).json()
    assert [(e["actor"], e["target"], e["result"], e["detail"]) for e in audit] == [
        ("admin", "eu-9", "not_found", ""),  # newest first
        ("admin", "eu-1", "ok", "firmware update"),
    ]


async def _looked_at(fed: InProcessFederation, workload_id: str) -> bool:
    """Placement gave it a reason to wait (it has been through a cycle)."""
    return bool((await fed.workload(workload_id))["message"])


async def test_two_spokes_cordoned_at_once_both_stay_cordoned(fed: InProcessFederation) -> None:
    """Two operators at once (a rack of two clusters): neither cordon is lost to the other's
    write, also after a restart; a reason with a control character is refused."""
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.start_spoke("eu-2", "eu", nodes("eu-2", 1, 1, "H100"))
    await fed.wait_spokes(2)
    assert fed.api is not None and fed.hub is not None
    api, state = fed.api, fed.hub.state
    rack = Cordon(by="ops", at=1.0, reason="rack 7")
    await asyncio.gather(*(cordons.put(state, s, rack) for s in ("eu-1", "eu-2")))
    listed = (await api.get("/v1/spokes")).json()
    assert {s["id"]: s["cordoned"]["reason"] for s in listed} == {
        "eu-1": "rack 7",
        "eu-2": "rack 7",
    }
    await fed.stop("hub")
    await fed.start_hub()
    assert fed.api is not None
    listed = (await fed.api.get("/v1/spokes")).json()
    assert sorted(s["id"] for s in listed if s["cordoned"]) == ["eu-1", "eu-2"]
    bad = await fed.api.put("/v1/spokes/eu-1/cordon", json={"reason": "fine\x1b[2Jgone"})
    assert bad.status_code == 422


async def test_a_drained_spoke_moves_the_work_that_may_move_and_names_the_rest(
    fed: InProcessFederation,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`gpufed drain` before maintenance: the spoke is cordoned, its movable work stops there
    and runs elsewhere without counting a restart, and the work that may not move (it would
    run again from the start) runs on, named for the operator."""
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    movable = await fed.submit(
        name="train", team="vision", command=["sleep", "300"], restart_policy="on_failure"
    )
    kept = await fed.submit(name="etl", team="vision", command=["sleep", "300"])
    for wid in (movable, kept):
        await fed.wait_phase(wid, {Phase.RUNNING})
    await fed.start_spoke("eu-2", "eu", nodes("eu-2", 1, 2, "H100"))
    await fed.wait_spokes(2)
    assert fed.api is not None

    member = fed.client(await fed.token("alice", "member", "vision"))
    refused = await member.post("/v1/spokes/eu-1/drain", json={})
    assert refused.status_code == 403 and "needs admin" in refused.json()["message"]
    await member.aclose()

    async with fed.serve() as url:
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        code = await asyncio.to_thread(main, ["drain", "eu-1", "--reason", "PSU swap"])
        out = capsys.readouterr().out
    assert code == 0
    assert out == (
        "spoke eu-1 cordoned and drained: 1 workload(s) stop there (with their grace) and "
        "queue again for elsewhere (gpufed uncordon to put it back)\n"
        f"  moved  {movable}  vision/train\n"
        "1 workload(s) run on there (cancel them, or wait for them to end):\n"
        f"  stays  {kept}  vision/etl  (restart_policy never: moved, it would run again from "
        "the start)\n"
    )
    await until(
        lambda: _runs_on(fed, movable, "eu-2"), 30, "the movable work to run on the other spoke"
    )
    moved = await fed.workload(movable)
    assert (moved["epoch"], moved["restarts"]) == (2, 0)  # preempted: no restart counted
    assert moved["attempts"][0]["end_reason"] == "preempted"
    assert any("drained by admin: PSU swap" in h["detail"] for h in moved["history"])
    stayed = await fed.workload(kept)
    assert (stayed["phase"], stayed["spoke_id"], stayed["epoch"]) == ("running", "eu-1", 1)
    spokes = {s["id"]: s for s in (await fed.api.get("/v1/spokes")).json()}
    assert spokes["eu-1"]["cordoned"]["reason"] == "PSU swap"
    audit = (await fed.api.get("/v1/audit", params={"action": "spoke.drain"})).json()
    assert [(e["actor"], e["result"], e["detail"]) for e in audit] == [
        ("admin", "ok", "1 requeued, 1 left running: PSU swap"),
        ("alice", "denied", ""),
    ]


async def test_a_drained_workloads_wait_and_run_add_up_its_attempts(
    fed: InProcessFederation,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stopped by a drain, queued again and run to its end: its run is both runs, its wait
    both waits (the API gave the latest attempt's run, and as its wait the time to its latest
    start, its first run included)."""
    wid, waiting = await drained(fed, sleep_s=2, ran_s=1)
    first = waiting["attempts"][0]
    assert waiting["run_s"] == pytest.approx(first["ended_at"] - first["started_at"], abs=0.002)
    await asyncio.sleep(1)  # waiting again: it counts
    assert fed.api is not None
    assert (await fed.api.delete("/v1/spokes/eu-1/cordon")).status_code == 200
    ended = await fed.wait_phase(wid, {Phase.SUCCEEDED}, timeout=30)
    runs = [a["ended_at"] - a["started_at"] for a in ended["attempts"]]
    assert len(runs) == 2 and runs[1] >= 2.0
    assert ended["run_s"] == pytest.approx(sum(runs), abs=0.002)
    ran = ended["finished_at"] - ended["submitted_at"]
    assert ended["wait_s"] == pytest.approx(ran - sum(runs), abs=0.002)
    assert ended["wait_s"] >= 1.0  # the second wait, after the drain
    async with fed.serve() as url:  # `gpufed jobs` shows the same
        monkeypatch.setenv("GPUFED_API", url)
        monkeypatch.setenv("GPUFED_TOKEN", fed.admin_token)
        capsys.readouterr()
        assert await asyncio.to_thread(main, ["jobs"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(wid))
    assert f"{ended['wait_s']:.1f}s" in row.split() and f"{ended['run_s']:.1f}s" in row.split()


async def drained(
    fed: InProcessFederation, sleep_s: int, ran_s: float
) -> tuple[str, dict[str, Any]]:
    """A hub and a spoke `eu-1` of one GPU; a `sleep sleep_s` of vision's (`on_failure`)
    drained off it once it has run `ran_s`: its id, and its record once queued again (`eu-1`
    stays cordoned)."""
    await fed.start_hub()
    assert fed.api is not None
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.wait_spokes(1)
    command = ["sleep", str(sleep_s)]
    wid = await fed.submit(
        name="train", team="vision", command=command, restart_policy="on_failure"
    )
    await fed.wait_phase(wid, {Phase.RUNNING})
    await asyncio.sleep(ran_s)
    assert (await fed.api.post("/v1/spokes/eu-1/drain", json={})).status_code == 200
    return wid, await fed.wait_phase(wid, {Phase.QUEUED}, timeout=30)


async def _runs_on(fed: InProcessFederation, workload_id: str, spoke_id: str) -> bool:
    record = await fed.workload(workload_id)
    return bool(record["phase"] == "running" and record["spoke_id"] == spoke_id)
