"""The local runtime against real processes: what a spoke killed at the worst moment finds,
where a workload starts and what it can see of the spoke."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import spoke.runtime.exitlog as exitlog_module
import spoke.runtime.runjournal as runjournal_module
from schemas import Assignment, EventPhase, WorkloadSpec
from spoke.errors import PermanentSpokeError
from spoke.ports import EventSink, Launch, RuntimeEvent
from spoke.runtime.local import LocalRuntime
from spoke.runtime.runas import RunAs
from tests.support.rendezvous import RENDEZVOUS
from tests.support.wait import wait_until


async def test_spoke_killed_between_spawn_and_recording_pids_still_adopts_the_process(
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    script = f"while [ ! -e {release} ]; do sleep 0.05; done; exit 3"
    launch = Launch(
        workload_id="w1",
        epoch=1,
        decision_id="w1-e1-place",
        spec=WorkloadSpec(name="w", team="t", command=("sh", "-c", script)),
        assignments=(Assignment(node="n0", devices=(0,)),),
    )
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    first = LocalRuntime(sink, tmp_path / "logs")
    await first.start(launch)
    journal = first.journal_path
    await first.close()  # the process runs on, as after a SIGKILL of the spoke
    # The crash window: the start was recorded, the pids not yet.
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    journal.write_text("".join(json.dumps(r) + "\n" for r in lines if r["t"] != "pids"))

    second = LocalRuntime(sink, tmp_path / "logs")
    try:
        assert await second.adopt() == {"w1": 1}  # found by its exit file's path in /proc
        release.touch()
        await wait_until(lambda: len(events) == 2, timeout=10, what="the end of w1")
    finally:
        await second.close()
    assert [(e.phase, e.exit_code) for e in events] == [
        (EventPhase.RUNNING, None),
        (EventPhase.FAILED, 3),  # its real exit code, read from the file its wrapper wrote
    ]


def _launch(workload_id: str, script: str) -> Launch:
    return Launch(
        workload_id=workload_id,
        epoch=1,
        decision_id=f"{workload_id}-e1-place",
        spec=WorkloadSpec(name="w", team="t", command=("sh", "-c", script)),
        assignments=(Assignment(node="n0", devices=(0,)),),
    )


async def _long_then_short_runs(
    tmp_path: Path, shorts: int, *, name: str = "long", code: int = 4
) -> tuple[LocalRuntime, EventSink, list[RuntimeEvent]]:
    """A runtime that started `name` (runs until `tmp_path/release` exists, then exits `code`),
    then `shorts` runs of `exit 0` one after another, each to its end; its sink and the events."""
    release = tmp_path / "release"
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    runtime = LocalRuntime(sink, tmp_path / "logs")
    script = f"while [ ! -e {release} ]; do sleep 0.05; done; exit {code}"
    await runtime.start(_launch(name, script))
    for n in range(shorts):
        await runtime.start(_launch(f"short{n}", "exit 0"))
        # RUNNING and SUCCEEDED of each so far, and long's RUNNING
        await wait_until(
            lambda seen=2 * (n + 1) + 1: len(events) == seen, timeout=10, what=f"short{n}'s end"
        )
    return runtime, sink, events


async def test_a_long_running_spoke_keeps_its_run_record_small_and_still_adopts_after_a_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every start writes its whole spec to runs.jsonl: a spoke running short jobs for months
    would keep (and read through on its next start) every one of them. The file is rewritten
    to the open runs once it grows; a run open across the rewrite is still adopted."""
    monkeypatch.setattr(runjournal_module, "COMPACT_AFTER_LINES", 12)
    # 15 short runs: 45 lines written, more than three rewrites' worth
    first, sink, events = await _long_then_short_runs(tmp_path, 15)
    journal = first.journal_path
    await first.close()  # `long` runs on, as after a SIGKILL of the spoke
    assert len(journal.read_text().splitlines()) < 12
    assert not journal.with_suffix(".tmp").exists()

    second = LocalRuntime(sink, tmp_path / "logs")
    try:
        assert await second.adopt() == {"long": 1}  # the short ones ended: nothing to adopt
        (tmp_path / "release").touch()
        await wait_until(lambda: events[-1].workload_id == "long", timeout=10, what="long's end")
    finally:
        await second.close()
    assert (events[-1].phase, events[-1].exit_code) == (EventPhase.FAILED, 4)
    assert sum(e.phase is EventPhase.SUCCEEDED for e in events) == 15


async def test_runs_leave_no_file_each_and_one_open_across_rotations_is_adopted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run's wrapper appends its exit code to a shared exit log instead of making a file of
    its own (a file creation is the dearest part of a start on some file systems). The log
    rotates; a run open across rotations, whose spoke is killed, still ends with its code."""
    monkeypatch.setattr(exitlog_module, "ROTATE_AFTER", 3)
    first, sink, events = await _long_then_short_runs(tmp_path, 10)
    await first.close()  # `long` runs on, as after a SIGKILL of the spoke
    # long's generation (still open) and the current one; nothing per run
    assert sorted(p.name for p in first.run_dir.iterdir()) == [
        "exits-0.txt", "exits-3.txt", "runs.jsonl"
    ]  # fmt: skip

    second = LocalRuntime(sink, tmp_path / "logs")
    try:
        assert await second.adopt() == {"long": 1}
        assert sorted(p.name for p in second.run_dir.iterdir()) == ["exits-0.txt", "runs.jsonl"]
        (tmp_path / "release").touch()
        await wait_until(lambda: events[-1].workload_id == "long", timeout=10, what="long's end")
    finally:
        await second.close()
    assert (events[-1].phase, events[-1].exit_code) == (EventPhase.FAILED, 4)
    assert [p.name for p in second.run_dir.iterdir()] == ["runs.jsonl"]


async def test_a_run_an_older_spoke_started_is_adopted_with_the_code_from_its_exit_file(
    tmp_path: Path,
) -> None:
    """A spoke upgraded while its workloads run: the runs the old version started name no exit
    log in runs.jsonl, and their wrappers write an exit file each."""
    first, sink, events = await _long_then_short_runs(tmp_path, 0, name="old", code=9)
    await first.close()
    journal = first.journal_path
    lines = [json.loads(line) for line in journal.read_text().splitlines()]
    for record in lines:
        record.pop("x", None)  # as the old version wrote it
    journal.write_text("".join(json.dumps(r) + "\n" for r in lines))

    second = LocalRuntime(sink, tmp_path / "logs")
    try:
        assert await second.adopt() == {"old": 1}
        (second.run_dir / "old-e1-r0.exit").write_text("5\n")  # what the old wrapper wrote
        (tmp_path / "release").touch()
        await wait_until(lambda: len(events) == 2, timeout=10, what="old's end")
    finally:
        await second.close()
    assert (events[-1].phase, events[-1].exit_code) == (EventPhase.FAILED, 5)
    assert not (second.run_dir / "old-e1-r0.exit").exists()


async def _run_to_end(runtime: LocalRuntime, launch: Launch, events: list[RuntimeEvent]) -> str:
    """Run `launch` to its end; its log."""
    try:
        await runtime.start(launch)
        await wait_until(lambda: len(events) == 2, timeout=10, what=f"the end of {launch}")
    finally:
        await runtime.close()
    return runtime.log_path(launch.workload_id, launch.epoch).read_text()


async def test_a_workload_starts_in_its_own_directory_without_the_spokes_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As under `gpufed up`: the spoke runs in the folder holding the data dir and its secrets,
    # with credentials in its own environment.
    (tmp_path / ".gpufed" / "secrets").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPUFED_NATS_CREDS", str(tmp_path / ".gpufed/secrets/creds/spoke.creds"))
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-workloads")
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    runtime = LocalRuntime(sink, tmp_path / ".gpufed/spokes/s1/logs")
    log = await _run_to_end(runtime, _launch("w1", "pwd; env"), events)

    lines = log.splitlines()
    assert lines[0] == str(tmp_path / ".gpufed/spokes/s1/work/w1")
    assert "secrets" not in log and "not-for-workloads" not in log
    assert events[-1].phase is EventPhase.SUCCEEDED


@pytest.fixture
def spoke_dir() -> Iterator[Path]:
    """A spoke folder others may enter, holding a 0600 credential of the spoke's. Not pytest's
    tmp_path: under root its folders are 0700, closed to the workload's user."""
    root = Path(tempfile.mkdtemp(prefix="gpufed-runas-"))
    try:
        root.chmod(0o755)
        (root / "spoke.creds").write_text("SECRET")
        (root / "spoke.creds").chmod(0o600)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="run_as needs the spoke to run as root")
async def test_run_as_starts_workloads_as_that_user_who_cannot_read_the_spokes_files(
    spoke_dir: Path,
) -> None:
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    runtime = LocalRuntime(sink, spoke_dir / "logs", run_as=RunAs.resolve("nobody"))
    script = (
        f'id -u; echo "home=$HOME"; cat {spoke_dir / "spoke.creds"} || echo refused; '
        'echo 40 > "$GPUFED_LOAD_FILE"; exit 4'
    )
    log = await _run_to_end(runtime, _launch("w2", script), events)

    assert log.splitlines()[0] == str(pwd.getpwnam("nobody").pw_uid)
    assert "home=/nonexistent" in log and "refused" in log and "SECRET" not in log
    # Its real exit code and its load report: the files it must write are its own.
    assert (events[-1].phase, events[-1].exit_code) == (EventPhase.FAILED, 4)
    assert (spoke_dir / "load" / "w2.load").read_text().strip() == "40"


def test_run_as_refuses_root_and_unknown_users() -> None:
    with pytest.raises(PermanentSpokeError):
        RunAs.resolve("root")
    with pytest.raises(PermanentSpokeError):
        RunAs.resolve("no-such-user-gpufed")


async def test_a_workload_runs_in_its_working_dir_and_a_missing_one_fails_it(
    tmp_path: Path,
) -> None:
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    workdir = tmp_path / "work dir"  # a space: the wrapper must quote it
    workdir.mkdir()
    runtime = LocalRuntime(sink, tmp_path / "logs")

    def launch(wid: str, directory: Path) -> Launch:
        return Launch(
            workload_id=wid,
            epoch=1,
            decision_id=f"{wid}-e1-place",
            spec=WorkloadSpec(
                name="w", team="t", command=("sh", "-c", "pwd; exit 4"), working_dir=str(directory)
            ),
            assignments=(Assignment(node="n0", devices=(0,)),),
        )

    try:
        await runtime.start(launch("w1", workdir))
        await runtime.start(launch("w2", tmp_path / "missing"))
        await wait_until(lambda: len(events) == 3, timeout=10, what="w1's end and w2's failure")
    finally:
        await runtime.close()
    by_workload = {(e.workload_id, e.phase): e for e in events}
    assert by_workload[("w1", EventPhase.FAILED)].exit_code == 4
    assert runtime.log_path("w1", 1).read_text().strip() == str(workdir)
    missing = by_workload[("w2", EventPhase.FAILED)]
    assert (missing.exit_code, missing.reason) == (127, "cannot_start")
    assert "No such file or directory" in missing.message


async def test_every_rank_writes_to_one_log_readable_from_the_start(tmp_path: Path) -> None:
    """The wrapper, not the spoke, creates the log: reading it just after the start finds an
    empty log rather than none, and every rank's output (stdout and stderr) ends up in it."""
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    release = tmp_path / "release"
    script = f'while [ ! -e {release} ]; do sleep 0.05; done; echo "out $0"; echo "err $0" >&2'
    launch = Launch(
        workload_id="gang",
        epoch=1,
        decision_id="gang-e1-place",
        spec=WorkloadSpec(name="w", team="t", command=("sh", "-c", script)),
        assignments=(Assignment(node="n0", devices=(0,)), Assignment(node="n1", devices=(0,))),
    )
    runtime = LocalRuntime(sink, tmp_path / "logs")
    try:
        await runtime.start(launch)
        first = runtime.read_log("gang", None, None, 1000)
        release.touch()
        await wait_until(lambda: len(events) == 2, timeout=10, what="the end of the gang")
        last = runtime.read_log("gang", 1, 0, 1000)
    finally:
        release.touch()  # close() leaves workloads running for a restarted spoke: end them here
        await runtime.close()
    assert (first.epoch, first.data) == (1, b"")
    assert sorted(last.data.decode().splitlines()) == ["err sh", "err sh", "out sh", "out sh"]
    assert [(e.phase, e.exit_code) for e in events] == [
        (EventPhase.RUNNING, None),
        (EventPhase.SUCCEEDED, 0),
    ]


async def test_a_stopped_workload_is_reported_ended_only_once_all_of_it_has_ended(
    tmp_path: Path,
) -> None:
    # Its TERM trap takes a while: the wrapper around it goes at once, the command does not.
    ready, done = tmp_path / "ready", tmp_path / "done"
    trap = f"trap 'sleep 0.5; echo bye > {done}; exit 143' TERM"
    script = f"{trap}; touch {ready}; while :; do sleep 0.05; done"
    events: list[RuntimeEvent] = []
    ended_with_it_done: list[bool] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)
        if event.phase != EventPhase.RUNNING:
            ended_with_it_done.append(done.exists())

    runtime = LocalRuntime(sink, tmp_path / "logs")
    try:
        await runtime.start(_launch("w1", script))
        await wait_until(ready.exists, timeout=10, what="w1 running, its trap set")
        await runtime.stop("w1", 5.0, EventPhase.PREEMPTED)
        await wait_until(lambda: len(events) == 2, timeout=10, what="the end of w1")
    finally:
        await runtime.close()
    assert events[1].phase == EventPhase.PREEMPTED
    assert ended_with_it_done == [True], "reported ended while its trap still ran"


async def test_a_workload_past_its_max_runtime_is_killed_and_says_so(tmp_path: Path) -> None:
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    runtime = LocalRuntime(sink, tmp_path / "logs")
    launch = _launch("w1", "echo started; sleep 60")
    launch = dataclasses.replace(launch, spec=launch.spec.model_copy(update={"max_runtime_s": 1}))
    log = await _run_to_end(runtime, launch, events)

    assert log.strip() == "started"
    end = events[-1]
    assert (end.phase, end.reason, end.exit_code) == (
        EventPhase.FAILED,
        "max_runtime_exceeded",
        -9,
    )
    assert end.message.startswith("killed at its max_runtime_s (1 s); exit code -9; log ")


async def test_a_gangs_ranks_meet_at_the_master_address_they_are_given(tmp_path: Path) -> None:
    """Every rank of a gang gets GPUFED_MASTER_ADDR and GPUFED_MASTER_PORT, where rank 0 can
    listen and the others reach it (what torchrun's --master_addr/--master_port need)."""
    events: list[RuntimeEvent] = []

    async def sink(event: RuntimeEvent) -> None:
        events.append(event)

    nodes = ("n0", "n1", "n2")
    launch = Launch(
        workload_id="train",
        epoch=1,
        decision_id="train-e1-place",
        spec=WorkloadSpec(name="w", team="t", nodes=3, command=RENDEZVOUS),
        assignments=tuple(Assignment(node=n, devices=(0,)) for n in nodes),
    )
    runtime = LocalRuntime(sink, tmp_path / "logs")
    try:
        await runtime.start(launch)
        await wait_until(lambda: len(events) == 2, timeout=60, what="the end of the gang")
        log = runtime.read_log("train", 1, 0, 10_000).data.decode()
    finally:
        await runtime.close()
    assert [(e.phase, e.exit_code) for e in events] == [
        (EventPhase.RUNNING, None),
        (EventPhase.SUCCEEDED, 0),
    ], log
    assert log.splitlines() == ["rank 0 of 3 met rank 1 on n1, rank 2 on n2"]
