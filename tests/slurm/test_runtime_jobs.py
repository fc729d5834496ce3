"""Workloads as real Slurm jobs: one node, a two-node gang, exit codes, refusals, retention."""

from __future__ import annotations

from pathlib import Path

import pytest

import spoke.runtime.slurm.runtime as slurm_runtime
from schemas import EventPhase
from spoke.errors import PermanentSpokeError
from spoke.runtime.retention import Keep
from spoke.runtime.slurm import SlurmRuntime
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import EventLog, launch
from tests.support.rendezvous import RENDEZVOUS


async def test_a_single_node_job_runs_with_its_environment_and_succeeds(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    script = (
        'echo "hello $GREETING from $GPUFED_WORKLOAD_ID on $GPUFED_NODE rank $GPUFED_NODE_RANK"'
    )
    await runtime.start(launch("hello", ["sh", "-c", script], env={"GREETING": "world"}))
    job_id = runtime.job_id("hello")
    assert job_id is not None
    shown = slurm_cluster.run("scontrol", "-o", "show", "job", job_id)
    assert "NodeList=n1" in shown and "TresPerNode=gres:gpu:2" in shown
    assert "JobName=gpufed-hello-e0" in shown and "Requeue=0" in shown

    end = await events.wait_end("hello")

    assert events.phases("hello") == [EventPhase.RUNNING, EventPhase.SUCCEEDED]
    assert end.exit_code == 0
    log = runtime.log_path("hello", 0)
    assert str(log) in end.message
    assert log.read_text().strip() == "hello world from hello on n1 rank 0"
    assert runtime.running() == {}


async def test_a_failing_command_reports_its_exit_code(
    runtime: SlurmRuntime, events: EventLog
) -> None:
    await runtime.start(launch("fails", ["sh", "-c", "echo oops >&2; exit 3"]))

    end = await events.wait_end("fails")

    assert end.phase is EventPhase.FAILED
    assert (end.exit_code, end.reason) == (3, "exit_code")
    assert "oops" in runtime.log_path("fails", 0).read_text()


async def test_a_missing_program_is_reported_as_such(
    runtime: SlurmRuntime, events: EventLog
) -> None:
    await runtime.start(launch("missing", ["/nonexistent/train"]))

    end = await events.wait_end("missing")

    assert end.phase is EventPhase.FAILED
    assert (end.exit_code, end.reason) == (127, "command_not_found")


async def test_the_spokes_own_environment_does_not_reach_the_job(
    runtime: SlurmRuntime, events: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFED_NATS_TOKEN", "s3cret")  # read by base_environment() at start
    await runtime.start(launch("env", ["sh", "-c", "env"], env={"API_KEY": "team-secret"}))

    await events.wait_end("env")

    variables = runtime.log_path("env", 0).read_text()
    assert "API_KEY=team-secret" in variables
    assert "s3cret" not in variables


async def test_a_two_node_gang_runs_one_task_on_each_node_together(
    runtime: SlurmRuntime, events: EventLog, slurm_cluster: SlurmCluster
) -> None:
    script = 'echo "rank $GPUFED_NODE_RANK of $GPUFED_NUM_NODES on $GPUFED_NODE"; sleep 1'
    await runtime.start(launch("gang", ["sh", "-c", script], nodes=("n1", "n2"), gpus=4))
    await events.wait_for("gang", EventPhase.RUNNING)
    job_id = runtime.job_id("gang")
    assert job_id is not None
    shown = slurm_cluster.run("scontrol", "-o", "show", "job", job_id)
    assert "NodeList=n[1-2]" in shown and "NumNodes=2" in shown

    end = await events.wait_end("gang")

    assert end.phase is EventPhase.SUCCEEDED
    lines = sorted(runtime.log_path("gang", 0).read_text().splitlines())
    assert lines == ["rank 0 of 2 on n1", "rank 1 of 2 on n2"]


async def test_a_gangs_ranks_meet_at_the_master_address_they_are_given(
    runtime: SlurmRuntime, events: EventLog
) -> None:
    """As on the other runtimes: rank 0 listens at $GPUFED_MASTER_ADDR:$GPUFED_MASTER_PORT
    (the node srun ran on, a port of the job's own) and the other ranks reach it there."""
    await runtime.start(launch("meet", list(RENDEZVOUS), nodes=("n1", "n2"), gpus=4))
    end = await events.wait_end("meet")
    log = runtime.log_path("meet", 0).read_text()
    assert end.phase is EventPhase.SUCCEEDED, log
    assert log.splitlines() == ["rank 0 of 2 met rank 1 on n2"]


async def test_a_gang_fails_as_a_whole_when_one_node_fails(
    runtime: SlurmRuntime, events: EventLog
) -> None:
    # Rank 1 fails at once; rank 0 would run for two minutes (past wait_end's limit), but srun
    # ends the whole step. Its exit code is srun's: the highest of the tasks' (143: SIGTERM).
    script = 'if [ "$GPUFED_NODE_RANK" = 1 ]; then exit 4; fi; exec sleep 120'
    await runtime.start(launch("gang-fail", ["sh", "-c", script], nodes=("n1", "n2")))

    end = await events.wait_end("gang-fail")

    assert end.phase is EventPhase.FAILED
    assert end.exit_code not in (None, 0)
    assert "task 1: Exited with exit code 4" in runtime.log_path("gang-fail", 0).read_text()


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"gpu_fraction": 0.5, "gpus_per_node": 1}, "fractional GPUs are not supported"),
        ({"env": {"SBATCH_PARTITION": "other"}}, "reserved"),
    ],
)
async def test_what_slurm_cannot_run_is_refused_with_the_reason(
    runtime: SlurmRuntime, spec: dict[str, object], words: str
) -> None:
    gpus = int(spec.pop("gpus_per_node", 2))  # type: ignore[call-overload]
    with pytest.raises(PermanentSpokeError, match=words):
        await runtime.start(launch("refused", ["true"], gpus=gpus, **spec))
    assert runtime.running() == {}


async def test_a_job_slurm_refuses_raises_slurms_reason(runtime: SlurmRuntime) -> None:
    with pytest.raises(PermanentSpokeError, match="sbatch failed"):
        await runtime.start(launch("too-big", ["true"], gpus=9))
    assert runtime.running() == {}


async def test_an_ended_jobs_log_goes_by_the_retention_rule_and_the_job_is_forgotten(
    slurm_cluster: SlurmCluster, events: EventLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spoke running jobs for months neither fills its log folder nor holds every job it
    ever submitted."""
    monkeypatch.setattr(slurm_runtime, "FINISHED_KEPT", 1)
    runtime = SlurmRuntime(
        slurm_cluster.cli(), events, "t-keep", tmp_path / "logs", poll_s=0.2, keep=Keep(3600, 1)
    )
    try:
        for name in ("first", "second"):
            await runtime.start(launch(name, ["sh", "-c", f"echo {name} done"]))
            await events.wait_end(name)
        assert runtime.job_id("first") is None  # only the last ended job is remembered
        assert runtime.job_id("second") is not None
        assert await runtime.leftovers.sweep() == 1
    finally:
        await runtime.close()
    assert not runtime.log_path("first", 0).exists()
    assert runtime.log_path("second", 0).read_text().strip() == "second done"
