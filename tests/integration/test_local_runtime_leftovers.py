"""What ended workloads leave on a spoke's disk (logs, workspaces, load files) goes by the
spoke's retention rule, against real processes and real files: a spoke running short jobs all
day must not fill its disk, and must never remove what a running workload uses."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from schemas import Assignment, WorkloadSpec
from spoke.errors import SpokeError
from spoke.ports import Launch, RuntimeEvent
from spoke.runtime.local import LocalRuntime
from spoke.runtime.retention import Keep
from tests.support.wait import wait_until

#: Each run leaves a result in its workspace and a load report, as real work does.
WRITES = 'echo result > result.txt; echo 0.5 > "$GPUFED_LOAD_FILE"'


def _launch(workload_id: str, script: str, epoch: int = 1) -> Launch:
    return Launch(
        workload_id=workload_id,
        epoch=epoch,
        decision_id=f"{workload_id}-e{epoch}-place",
        spec=WorkloadSpec(name="w", team="t", command=("sh", "-c", script)),
        assignments=(Assignment(node="n0", devices=(0,)),),
    )


class _Spoke:
    """A local runtime under tmp_path and the events it reported."""

    def __init__(self, tmp_path: Path, keep: Keep) -> None:
        self.events: list[RuntimeEvent] = []
        self.runtime = LocalRuntime(self._sink, tmp_path / "logs", keep=keep)
        self.logs, self.work = self.runtime.log_dir, self.runtime.work_dir
        self.load = self.runtime.load_dir

    async def _sink(self, event: RuntimeEvent) -> None:
        self.events.append(event)

    async def run(self, launch: Launch) -> None:
        """Start `launch` and wait for its end."""
        ends = len(self.events) + 2  # RUNNING, then its end
        await self.runtime.start(launch)
        await wait_until(lambda: len(self.events) >= ends, timeout=10, what=f"{launch}'s end")

    def files_of(self, workload_id: str) -> list[str]:
        """What is on disk of `workload_id`: its logs, its workspace's files, its load file."""
        found = sorted(p.name for p in self.logs.glob(f"{workload_id}-e*.log"))
        workspace = self.work / workload_id
        if workspace.exists():
            found += [f"work/{p.name}" for p in sorted(workspace.iterdir())]
        if (self.load / f"{workload_id}.load").exists():
            found.append("load")
        return found


async def test_the_oldest_ended_workloads_files_go_once_more_than_the_count_have_ended(
    tmp_path: Path,
) -> None:
    spoke = _Spoke(tmp_path, Keep(seconds=3600, count=2))
    try:
        for n in range(4):
            await spoke.run(_launch(f"w{n}", WRITES))
        assert spoke.files_of("w0") == ["w0-e1.log", "work/result.txt", "load"]

        assert await spoke.runtime.leftovers.sweep() == 2
        assert await spoke.runtime.leftovers.sweep() == 0  # nothing more is due
    finally:
        await spoke.runtime.close()
    assert spoke.files_of("w0") == spoke.files_of("w1") == []
    assert spoke.files_of("w3") == ["w3-e1.log", "work/result.txt", "load"]
    assert sorted(p.name for p in spoke.work.iterdir()) == ["w2", "w3"]  # none left aside
    with pytest.raises(SpokeError, match="is kept for 1 hour, the last 2 at most"):
        spoke.runtime.read_log("w0", None, None, 100)
    assert spoke.runtime.read_log("w3", None, None, 100).data == b""


async def test_a_workload_started_again_here_keeps_its_workspace_and_earlier_logs(
    tmp_path: Path,
) -> None:
    """Requeued to the same spoke, a workload finds the folder it left (a checkpoint, say);
    once it ends for good, the logs of both its runs go with it."""
    spoke = _Spoke(tmp_path, Keep(seconds=3600, count=0))
    release = tmp_path / "release"
    second = f'cat result.txt; while [ ! -e "{release}" ]; do sleep 0.05; done'
    try:
        await spoke.run(_launch("w", WRITES, epoch=1))
        await spoke.runtime.start(_launch("w", second, epoch=2))
        assert await spoke.runtime.leftovers.sweep() == 0
        await wait_until(
            lambda: spoke.runtime.read_log("w", 2, 0, 100).data == b"result\n",
            timeout=10,
            what="the second run reading the first run's result",
        )
        assert spoke.files_of("w") == ["w-e1.log", "w-e2.log", "work/result.txt", "load"]
        release.touch()
        await wait_until(lambda: len(spoke.events) == 4, timeout=10, what="w's second end")
        assert await spoke.runtime.leftovers.sweep() == 1
    finally:
        release.touch()
        await spoke.runtime.close()
    assert spoke.files_of("w") == []


async def test_a_workload_started_again_while_its_files_go_starts_in_a_fresh_workspace(
    tmp_path: Path,
) -> None:
    """Its start waits for the removal under way: it never runs in a folder being emptied."""
    spoke = _Spoke(tmp_path, Keep(seconds=3600, count=0))
    many = "for i in $(seq 3000); do : > f$i; done"  # a removal that takes a while
    try:
        await spoke.run(_launch("w", many, epoch=1))
        sweep = asyncio.create_task(spoke.runtime.leftovers.sweep())
        await wait_until(lambda: spoke.runtime.leftovers.removing("w"), what="w's removal")
        await spoke.run(_launch("w", "ls | wc -l; echo new > mine", epoch=2))
        assert await sweep == 1
    finally:
        await spoke.runtime.close()
    assert spoke.runtime.read_log("w", 2, 0, 100).data.strip() == b"0"  # none of the 3,000
    assert (spoke.work / "w" / "mine").read_text() == "new\n"


async def test_a_restarted_spoke_removes_what_an_earlier_one_left_past_its_time(
    tmp_path: Path,
) -> None:
    """The files of workloads that ended before a restart are found on disk: those older than
    the rule allows go; a recent one stays, and so does an old one whose workload still runs,
    and any file not a workload's."""
    keep = Keep(seconds=24 * 3600, count=100)
    release = tmp_path / "release"
    first = _Spoke(tmp_path, keep)
    await first.run(_launch("old", WRITES))
    await first.run(_launch("recent", WRITES))
    await first.runtime.start(
        _launch("runs", f'{WRITES}; while [ ! -e "{release}" ]; do sleep 0.05; done')
    )
    await first.runtime.close()  # `runs` runs on, as after a SIGKILL of the spoke
    two_days_ago = time.time() - 2 * 24 * 3600
    (first.logs / "old-e2.log").touch()  # an epoch an earlier spoke process ran
    for wid in ("old", "runs"):
        await wait_until(lambda w=wid: (first.load / f"{w}.load").exists(), what=f"{wid}'s load")
        for path in (
            *first.logs.glob(f"{wid}-e*.log"),
            first.work / wid,
            first.load / f"{wid}.load",
        ):
            os.utime(path, (two_days_ago, two_days_ago))
    (first.logs / "notes.txt").write_text("an operator's file")

    second = _Spoke(tmp_path, keep)
    try:
        assert await second.runtime.adopt() == {"runs": 1}
        await wait_until(
            lambda: not second.files_of("old"),
            timeout=10,
            what="the old workload's files to go",
        )
        assert second.files_of("recent") == ["recent-e1.log", "work/result.txt", "load"]
        assert second.files_of("runs") == ["runs-e1.log", "work/result.txt", "load"]
        assert (second.logs / "notes.txt").exists()
    finally:
        release.touch()
        await wait_until(lambda: bool(second.events), timeout=10, what="runs' end")
        await second.runtime.close()
