"""The local runtime against real processes: what a spoke killed at the worst moment finds."""

from __future__ import annotations

import json
from pathlib import Path

from schemas import Assignment, EventPhase, WorkloadSpec
from spoke.ports import Launch, RuntimeEvent
from spoke.runtime.local import LocalRuntime
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
