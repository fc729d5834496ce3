"""A spoke that stops for good (and never comes back) still fences its movable work: its
watchdog (spoke.runtime.watchdog) stops it once the spoke's lease has run out, before the hub
runs it elsewhere, so it never runs twice at once; the work that may not move runs on.

Before, a spoke process stopped for longer than lost_after left its workloads running, while
the hub ran the movable ones again on another spoke: two copies of one training job, both
writing its checkpoints, until the first spoke came back.
"""

from __future__ import annotations

from pathlib import Path

from schemas import Phase
from spoke.fencing import STOPPED_WITHOUT_SPOKE
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

#: The hub's lease here: fence_after is 10 - 2 (stop grace) - 3 x 0.5 (heartbeats) = 6.5 s.
LOST_AFTER_S = 10.0


def ticks(path: Path) -> list[tuple[str, float]]:
    """(epoch, time) of each line a workload below wrote."""
    out = []
    for line in path.read_text().splitlines():
        epoch, _, at = line.partition(" ")
        if at:
            out.append((epoch, float(at)))
    return out


async def test_a_spoke_gone_for_good_stops_its_movable_work_before_it_runs_elsewhere(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    await fed.start_hub(suspect_after_s=3.0, lost_after_s=LOST_AFTER_S)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"), heartbeat_s=0.5)
    await fed.wait_spokes(1)
    moved, stays = tmp_path / "moved.ticks", tmp_path / "stays.ticks"

    def loop(path: Path) -> list[str]:
        tick = f'echo "$GPUFED_EPOCH $(date +%s.%N)" >> {path}'
        return ["sh", "-c", f"while true; do {tick}; sleep 0.1; done"]

    movable = await fed.submit(
        name="train", team="vision", command=loop(moved), restart_policy="on_failure"
    )
    kept = await fed.submit(name="etl", team="vision", command=loop(stays))
    for wid in (movable, kept):
        await fed.wait_phase(wid, {Phase.RUNNING})
    await fed.start_spoke("eu-2", "eu", nodes("eu-2", 1, 2, "H100"), heartbeat_s=0.5)
    await fed.wait_spokes(2)

    assert fed.hub is not None
    hub, heard = fed.hub, fed.hub.reports["eu-1"].seq
    await wait_until(lambda: hub.reports["eu-1"].seq > heard + 2, 10, "eu-1 heard a while")
    await fed.stop("eu-1")  # for good: nothing brings it back
    await wait_until(
        lambda: sum(epoch == "2" for epoch, _ in ticks(moved)) >= 10,
        60,
        "the job to run a second on eu-2",
    )
    record = await fed.workload(movable)
    assert (record["spoke_id"], record["epoch"]) == ("eu-2", 2)
    first = [at for epoch, at in ticks(moved) if epoch == "1"]
    second = [at for epoch, at in ticks(moved) if epoch == "2"]
    assert max(first) < min(second)  # the first copy had stopped: never two at once
    # The work that may not move (restart_policy never) runs on where it was.
    seen = len(ticks(stays))
    await wait_until(lambda: len(ticks(stays)) > seen + 3, 10, "the kept job to go on")
    log = (fed.root / "spokes" / "eu-1" / "runs" / "watchdog.log").read_text()
    assert f"fencing {movable}: its spoke is gone, its lease ran out" in log
    assert kept not in log
    # Its owner reads why the first copy ended, in that copy's own log.
    first_log = fed.root / "spokes" / "eu-1" / "logs" / f"{movable}-e1.log"
    assert first_log.read_text().endswith(f"{STOPPED_WITHOUT_SPOKE}\n")


async def test_a_spoke_back_after_its_watchdog_fenced_reports_the_work_preempted(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    """Back after its watchdog stopped its work (and before the hub gave the spoke up), the
    spoke says the work was preempted (fenced): queued again without a restart counted, not
    failed with an exit no one recorded."""
    await fed.start_hub(suspect_after_s=3.0, lost_after_s=LOST_AFTER_S)
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"), heartbeat_s=0.5)
    await fed.wait_spokes(1)
    wid = await fed.submit(
        name="train", team="vision", command=["sleep", "300"], restart_policy="on_failure"
    )
    await fed.wait_phase(wid, {Phase.RUNNING})
    assert fed.hub is not None
    hub, heard = fed.hub, fed.hub.reports["eu-1"].seq
    await wait_until(lambda: hub.reports["eu-1"].seq > heard + 2, 10, "eu-1 heard a while")
    await fed.stop("eu-1")
    log = fed.root / "spokes" / "eu-1" / "runs" / "watchdog.log"
    await wait_until(lambda: log.exists() and wid in log.read_text(), 30, "the watchdog to fence")
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"), heartbeat_s=0.5)
    await wait_until(lambda: _ran_twice(fed, wid), 30, "the job to run again")
    record = await fed.workload(wid)
    assert record["restarts"] == 0
    assert record["attempts"][0]["end_reason"] == "preempted"


async def _ran_twice(fed: InProcessFederation, wid: str) -> bool:
    record = await fed.workload(wid)
    return bool(record["phase"] == "running" and record["epoch"] == 2)
