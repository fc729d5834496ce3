"""Fixtures for the Slurm inventory and runtime: a real Slurm cluster (cluster.py), started once
per test run and shared by the tests, each of which uses a spoke id of its own."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Protocol

import pytest

from schemas import Assignment, EventPhase, WorkloadSpec
from spoke.fencing import Guard
from spoke.ports import Launch, RuntimeEvent
from spoke.runtime.slurm import SlurmRuntime
from tests.slurm.cluster import SlurmCluster, why_not_runnable
from tests.support.wait import wait_until


class EventLog:
    """The runtime's EventSink: keeps every event, lets a test wait for some."""

    def __init__(self) -> None:
        self.events: list[RuntimeEvent] = []

    async def __call__(self, event: RuntimeEvent) -> None:
        self.events.append(event)

    def phases(self, workload_id: str) -> list[EventPhase]:
        return [e.phase for e in self.events if e.workload_id == workload_id]

    def terminal_events(self, workload_id: str) -> list[RuntimeEvent]:
        return [
            e for e in self.events
            if e.workload_id == workload_id and e.phase is not EventPhase.RUNNING
        ]  # fmt: skip

    def terminal(self, workload_id: str) -> RuntimeEvent:
        """The one terminal event of `workload_id` (the test fails if there are more)."""
        ends = self.terminal_events(workload_id)
        assert len(ends) == 1, ends
        return ends[0]

    async def wait_for(self, workload_id: str, phase: EventPhase, limit_s: float = 30) -> None:
        """Wait until `workload_id` reported `phase`; fail the test after `limit_s` seconds."""
        await wait_until(
            lambda: phase in self.phases(workload_id), limit_s, f"{workload_id} {phase.value}"
        )

    async def wait_end(self, workload_id: str, limit_s: float = 30) -> RuntimeEvent:
        """Wait for the terminal event of `workload_id` and return it."""
        await wait_until(
            lambda: bool(self.terminal_events(workload_id)), limit_s, f"{workload_id}'s end"
        )
        return self.terminal(workload_id)


def launch(
    workload_id: str,
    command: list[str],
    nodes: tuple[str, ...] = ("n1",),
    gpus: int = 2,
    epoch: int = 0,
    **spec: object,
) -> Launch:
    """A launch of `command` on `gpus` GPUs of each of `nodes`."""
    return Launch(
        workload_id=workload_id,
        epoch=epoch,
        decision_id=f"d-{workload_id}-{epoch}",
        spec=WorkloadSpec.model_validate(
            {
                "name": "job",
                "team": "vision",
                "command": command,
                "gpus_per_node": gpus,
                "nodes": len(nodes),
                **spec,
            }
        ),
        assignments=tuple(Assignment(node=n, devices=tuple(range(gpus))) for n in nodes),
    )


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    reason = why_not_runnable()
    if reason is not None:
        # Once per run, on the terminal even without -rs: every Slurm test skips for this.
        plugins = request.config.pluginmanager
        reporter, capture = (
            plugins.get_plugin("terminalreporter"),
            plugins.get_plugin("capturemanager"),
        )
        if reporter is not None and capture is not None:
            with capture.global_and_fixture_disabled():
                reporter.write_line(f"SKIPPED: {reason}", yellow=True, bold=True)
        pytest.skip(reason)
    # Not pytest's tmp_path: munged wants every directory above its socket searchable.
    root = Path(tempfile.mkdtemp(prefix="gpufed-slurm-"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def events() -> EventLog:
    return EventLog()


class MakeRuntime(Protocol):
    def __call__(self, sink: EventLog, guard: Guard | None = None) -> SlurmRuntime: ...


@pytest.fixture
async def make_runtime(
    slurm_cluster: SlurmCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[MakeRuntime]:
    """Build runtimes of one spoke (several for restart tests), sharing its log and run dirs
    (`guard`: the spoke's fence rule, for its fenced jobs' lease); all closed at the end, and
    any job the test left behind is cancelled."""
    spoke_id = f"t-{request.node.name.removeprefix('test_')[:40]}".replace("_", "-")
    made: list[SlurmRuntime] = []

    def make(sink: EventLog, guard: Guard | None = None) -> SlurmRuntime:
        logs = tmp_path / "logs"
        runtime = SlurmRuntime(slurm_cluster.cli(), sink, spoke_id, logs, poll_s=0.2, guard=guard)
        made.append(runtime)
        return runtime

    try:
        yield make
    finally:
        for runtime in made:
            for workload_id in list(runtime.running()):
                job_id = runtime.job_id(workload_id)
                if job_id is not None:
                    slurm_cluster.run("scancel", job_id)
            await runtime.close()


@pytest.fixture
async def runtime(
    make_runtime: Callable[[EventLog], SlurmRuntime], events: EventLog
) -> SlurmRuntime:
    """A runtime that has adopted (nothing) and polls."""
    built = make_runtime(events)
    await built.adopt()
    return built
