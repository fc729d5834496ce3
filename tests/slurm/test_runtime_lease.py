"""A fenced Slurm job stops itself once its spoke's lease runs out, with the spoke gone for good:
the hub's copy never runs beside it. Real Slurm daemons; the spoke's fence state written as the
agent writes it (spoke.fencing)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from schemas import EventPhase
from spoke.fencing import STOPPED_WITHOUT_SPOKE, Guard, fence_file
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import EventLog, MakeRuntime, launch
from tests.support.wait import wait_until

FENCE_AFTER_S = 4.0
GRACE_S = 2.0
#: The hub's lost_after: the moved copy may start from then (far past FENCE_AFTER_S + GRACE_S).
LOST_AFTER_S = 30.0


def ticker(out: Path) -> list[str]:
    """Appends the time to `out` every 0.2 s until stopped (its side effect: when it ran)."""
    return ["sh", "-c", f'while :; do date +%s.%N >> "{out}"; sleep 0.2; done']


def last_tick(out: Path) -> float:
    return max(float(tick) for tick in out.read_text().split())


def heard(state_dir: Path, at: float) -> None:
    """The spoke heard the hub at `at` (its fence.json, as `Fence.save` writes it)."""
    path = fence_file(state_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps({"heard_at": at, "lost_after_s": LOST_AFTER_S, "kept": [], "term": 1})
    )
    tmp.replace(path)


@pytest.fixture
def guard(tmp_path: Path) -> Guard:
    """The spoke's fence rule over its state in `tmp_path/fence.json`."""
    return Guard(fence_file(tmp_path), heartbeat_s=1.0, stop_grace_s=GRACE_S,
                 fence_after_s=FENCE_AFTER_S)  # fmt: skip


def active(cluster: SlurmCluster, job_id: str) -> bool:
    shown = cluster.run("scontrol", "-o", "show", "job", job_id)
    return shown.split("JobState=", 1)[1].split()[0] in ("RUNNING", "PENDING", "COMPLETING")


async def test_a_fenced_job_stops_itself_once_the_lease_runs_out_with_its_spoke_gone(
    make_runtime: MakeRuntime, guard: Guard, slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    moved_out, kept_out = tmp_path / "moved.ticks", tmp_path / "kept.ticks"
    heard(tmp_path, time.time())
    before = EventLog()
    first = make_runtime(before, guard)
    await first.adopt()
    # A two-node gang: the watcher's SIGTERM reaches the task on each node through srun.
    moved = launch("moved", ticker(moved_out), nodes=("n1", "n2"), restart_policy="on_failure")
    await first.start(moved)
    await first.start(launch("kept", ticker(kept_out), nodes=("n2",)))  # restart_policy never
    await before.wait_for("moved", EventPhase.RUNNING)
    await before.wait_for("kept", EventPhase.RUNNING)
    moved_job = first.job_id("moved")
    assert moved_job is not None

    # While the spoke hears the hub, its lease moves on: the job runs past fence_after.
    started = time.time()
    while time.time() - started < FENCE_AFTER_S + 3:
        heard(tmp_path, time.time())
        await asyncio.sleep(0.5)
    assert active(slurm_cluster, moved_job)
    assert last_tick(moved_out) > started + FENCE_AFTER_S + 2

    # The spoke goes for good: nothing renews the lease, nobody polls.
    last_heard = time.time()
    heard(tmp_path, last_heard)
    await first.close()
    await wait_until(
        lambda: not active(slurm_cluster, moved_job), 30, "the moved job's end", every=0.2
    )
    # Gone within fence_after, a check and the grace: long before the hub's lost_after.
    assert last_tick(moved_out) < last_heard + FENCE_AFTER_S + 1 + GRACE_S + 1
    assert last_tick(moved_out) < last_heard + LOST_AFTER_S
    assert STOPPED_WITHOUT_SPOKE in first.log_path("moved", 0).read_text()  # its owner reads why
    # What may not move runs on.
    kept_then = last_tick(kept_out)
    await wait_until(lambda: last_tick(kept_out) > kept_then + 1, 10, "the kept job's ticks")

    # A spoke that comes back reports the job preempted by its lease, not failed.
    after = EventLog()
    second = make_runtime(after, guard)
    assert await second.adopt() == {"kept": 0}
    end = await after.wait_end("moved")
    assert (end.phase, end.reason) == (EventPhase.PREEMPTED, "fenced")
    assert not (first.run_dir / "moved-e0.fenced").exists()  # its end reported, the note goes
