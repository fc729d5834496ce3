"""A restarted spoke finds its Slurm jobs again by their comment, and reports each end once."""

from __future__ import annotations

from collections.abc import Callable

from schemas import EventPhase
from spoke.runtime.slurm import SlurmRuntime
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import EventLog, launch
from tests.support.wait import wait_until

Make = Callable[[EventLog], SlurmRuntime]


async def test_a_restarted_spoke_adopts_running_jobs_and_reports_their_end(
    make_runtime: Make, slurm_cluster: SlurmCluster
) -> None:
    before = EventLog()
    first = make_runtime(before)
    await first.adopt()
    flags = first.log_dir.parent

    def waits_for(flag: str, code: int) -> list[str]:
        """Runs until the test creates the file `flag`, then exits `code`."""
        path = flags / flag
        return ["sh", "-c", f'while [ ! -e "{path}" ]; do sleep 0.1; done; exit {code}']

    await first.start(launch("long", waits_for("long-go", 0), nodes=("n1", "n2")))
    await first.start(launch("short", waits_for("short-go", 3), nodes=("n2",)))
    await before.wait_for("long", EventPhase.RUNNING)
    await before.wait_for("short", EventPhase.RUNNING)
    long_job, short_job = first.job_id("long"), first.job_id("short")
    assert long_job is not None and short_job is not None
    await first.close()  # the spoke stops; its jobs do not
    (flags / "short-go").touch()  # "short" ends while no spoke watches
    await wait_until(
        lambda: "JobState=FAILED" in slurm_cluster.run("scontrol", "-o", "show", "job", short_job),
        30,
        "the short job's end in Slurm",
        every=0.2,
    )

    after = EventLog()
    second = make_runtime(after)
    adopted = await second.adopt()

    assert adopted == {"long": 0}
    assert second.job_id("long") == long_job
    end = after.terminal("short")  # reported at adoption
    assert (end.phase, end.exit_code) == (EventPhase.FAILED, 3)
    assert before.terminal_events("short") == []
    (flags / "long-go").touch()
    end = await after.wait_end("long")
    assert (end.phase, end.exit_code) == (EventPhase.SUCCEEDED, 0)

    third_log = EventLog()
    third = make_runtime(third_log)
    assert await third.adopt() == {}
    assert third_log.events == []  # both ends were reported already


async def test_an_end_slurm_forgot_is_read_from_the_exit_file(
    make_runtime: Make, slurm_cluster: SlurmCluster
) -> None:
    first_log = EventLog()
    first = make_runtime(first_log)
    await first.adopt()
    await first.start(launch("forgotten", ["sh", "-c", "exit 6"]))
    await first_log.wait_end("forgotten")
    # As if this end had never been reported and Slurm had dropped the job (past MinJobAge):
    # the spoke's record still lists the job, under an id the controller does not know.
    await first.close()
    record = first.run_dir / "slurm-jobs.jsonl"
    record.write_text('{"t":"job","w":"forgotten","e":0,"j":"999999"}\n')
    (first.run_dir / "forgotten-e0.exit").write_text("6\n")

    second_log = EventLog()
    second = make_runtime(second_log)
    assert await second.adopt() == {}

    end = second_log.terminal("forgotten")
    assert (end.phase, end.exit_code, end.reason) == (EventPhase.FAILED, 6, "exit_code")


async def test_an_older_epoch_found_at_adoption_is_cancelled(
    make_runtime: Make, slurm_cluster: SlurmCluster
) -> None:
    first_log = EventLog()
    first = make_runtime(first_log)
    await first.adopt()
    await first.start(launch("twice", ["sleep", "60"], epoch=1))
    old_job = first.job_id("twice")
    assert old_job is not None
    await first.close()
    # A second process (say, one started while this one hung) ran epoch 2 of the same workload.
    other = make_runtime(EventLog())
    await other.start(launch("twice", ["sleep", "60"], epoch=2, nodes=("n2",)))
    await other.close()

    adopted = await make_runtime(EventLog()).adopt()

    assert adopted == {"twice": 2}
    await wait_until(
        lambda: "CANCELLED" in slurm_cluster.run("scontrol", "-o", "show", "job", old_job),
        30,
        "the older epoch's job cancelled",
        every=0.2,
    )
