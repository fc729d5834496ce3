"""Cancel, preemption and fencing of real Slurm jobs."""

from __future__ import annotations

from schemas import EventPhase
from spoke.runtime.slurm import SlurmRuntime
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import EventLog, launch
from tests.support.wait import wait_until

#: Says it started, then on SIGTERM says so and exits 7 (a checkpointing trainer, in short).
GRACEFUL = 'trap "echo got TERM; exit 7" TERM; echo started; while :; do sleep 0.1; done'
#: Ignores SIGTERM: only the kill after the grace ends it.
STUBBORN = 'trap "echo ignoring TERM" TERM; echo started; while :; do sleep 0.1; done'


def job_state(cluster: SlurmCluster, job_id: str) -> str:
    shown = cluster.run("scontrol", "-o", "show", "job", job_id)
    return shown.split("JobState=", 1)[1].split()[0]


async def wait_started(runtime: SlurmRuntime, events: EventLog, workload_id: str) -> None:
    """Until the job runs and its command has printed "started" (its trap is set)."""
    await events.wait_for(workload_id, EventPhase.RUNNING)
    log = runtime.log_path(workload_id, 0)
    await wait_until(lambda: log.exists() and "started" in log.read_text(), 30, "started")


async def test_cancel_gives_the_command_sigterm_and_reports_cancelled(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    await runtime.start(launch("cancel-me", ["sh", "-c", GRACEFUL]))
    await wait_started(runtime, events, "cancel-me")
    job_id = runtime.job_id("cancel-me")
    assert job_id is not None

    await runtime.stop("cancel-me", 10.0, EventPhase.CANCELLED)

    end = events.terminal("cancel-me")
    assert end.phase is EventPhase.CANCELLED
    assert "got TERM" in runtime.log_path("cancel-me", 0).read_text()
    assert job_state(slurm_cluster, job_id) not in ("RUNNING", "PENDING", "COMPLETING")
    assert runtime.running() == {}
    await runtime.stop("cancel-me", 10.0, EventPhase.CANCELLED)  # again: a no-op
    assert len([e for e in events.events if e.workload_id == "cancel-me"]) == 2


async def test_preemption_kills_a_job_that_ignores_sigterm_after_the_grace(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    await runtime.start(launch("stubborn", ["sh", "-c", STUBBORN], nodes=("n1", "n2")))
    await wait_started(runtime, events, "stubborn")
    job_id = runtime.job_id("stubborn")
    assert job_id is not None

    await runtime.stop("stubborn", 1.0, EventPhase.PREEMPTED)

    end = events.terminal("stubborn")
    assert end.phase is EventPhase.PREEMPTED
    assert "ignoring TERM" in runtime.log_path("stubborn", 0).read_text()
    assert job_state(slurm_cluster, job_id) == "CANCELLED"


async def test_a_pending_job_is_cancelled_at_once(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    # Someone else's job holds every GPU of n2 for a while: ours has to wait.
    blocker = slurm_cluster.run(
        "sbatch", "--parsable", "-w", "n2", "--gres=gpu:8", "--wrap", "sleep 60"
    ).strip()
    try:
        await runtime.start(launch("waits", ["true"], nodes=("n2",)))
        job_id = runtime.job_id("waits")
        assert job_id is not None
        await wait_until(
            lambda: job_state(slurm_cluster, job_id) == "PENDING", 30, "pending", every=0.2
        )

        await runtime.stop("waits", 30.0, EventPhase.CANCELLED)

        assert events.phases("waits") == [EventPhase.CANCELLED]  # it never ran
        assert job_state(slurm_cluster, job_id) == "CANCELLED"
    finally:
        slurm_cluster.run("scancel", blocker)


async def test_a_newer_epoch_replaces_the_running_one(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    await runtime.start(launch("moved", ["sleep", "60"], epoch=1))
    await events.wait_for("moved", EventPhase.RUNNING)
    old_job = runtime.job_id("moved")
    assert old_job is not None

    await runtime.start(launch("moved", ["true"], epoch=2, nodes=("n2",)))
    await runtime.start(launch("moved", ["true"], epoch=2, nodes=("n2",)))  # repeated: no-op

    assert [(e.epoch, e.phase, e.reason) for e in events.events if e.epoch == 1] == [
        (1, EventPhase.RUNNING, ""),
        (1, EventPhase.CANCELLED, "stale_epoch"),
    ]
    assert job_state(slurm_cluster, old_job) == "CANCELLED"
    await events.wait_for("moved", EventPhase.SUCCEEDED)
    assert [e.epoch for e in events.events if e.phase is EventPhase.SUCCEEDED] == [2]
