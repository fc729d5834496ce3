"""Run workloads as local processes: one per assigned node, pinned with CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from schemas import EventPhase
from spoke.ports import EventSink, Launch, RuntimeEvent

log = structlog.get_logger(__name__)


@dataclass
class _Run:
    launch: Launch
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    stop_phase: EventPhase | None = None
    stop_reason: str = ""
    watcher: asyncio.Task[None] | None = None


class LocalRuntime:
    """Subprocess per workload (per node of a gang), logs to one file per workload and epoch.

    Each process starts in its own session so a stop reaches its children too.
    """

    def __init__(self, sink: EventSink, log_dir: Path) -> None:
        self._sink = sink
        self.log_dir = log_dir
        self._runs: dict[str, _Run] = {}

    async def start(self, launch: Launch) -> None:
        current = self._runs.get(launch.workload_id)
        if current is not None:
            if current.launch.epoch >= launch.epoch:
                return  # already started under this (or a newer) assignment
            await self.stop(launch.workload_id, 0.0, EventPhase.PREEMPTED)
        run = _Run(launch)
        self._runs[launch.workload_id] = run
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(launch.workload_id, launch.epoch)
        try:
            # Opening a local log file is a quick syscall; not worth a thread hop per start.
            with open(log_path, "ab") as out:  # noqa: ASYNC230
                for rank, assignment in enumerate(launch.assignments):
                    env = _environment(launch, rank)
                    proc = await asyncio.create_subprocess_exec(
                        *launch.spec.command,
                        cwd=launch.spec.working_dir or None,
                        env=env,
                        stdin=asyncio.subprocess.DEVNULL,
                        stdout=out,
                        stderr=asyncio.subprocess.STDOUT,
                        start_new_session=True,
                    )
                    run.procs.append(proc)
                    log.info(
                        "process_started",
                        workload=launch.workload_id,
                        pid=proc.pid,
                        node=assignment.node,
                        devices=env["CUDA_VISIBLE_DEVICES"],
                    )
        except OSError as exc:
            # The command cannot run (not found, not executable, bad working dir): the
            # workload fails like a shell's 127, it is not the spoke's fault.
            self._kill(run, signal.SIGKILL)
            del self._runs[launch.workload_id]
            await self._sink(
                RuntimeEvent(
                    launch.workload_id,
                    launch.epoch,
                    EventPhase.FAILED,
                    exit_code=127,
                    reason="cannot_start",
                    message=f"cannot start {launch.spec.command[0]!r}: {exc.strerror or exc}",
                )
            )
            return
        await self._sink(RuntimeEvent(launch.workload_id, launch.epoch, EventPhase.RUNNING))
        run.watcher = asyncio.create_task(self._watch(run), name=f"watch-{launch.workload_id}")

    async def stop(self, workload_id: str, grace_s: float, phase: EventPhase) -> None:
        run = self._runs.get(workload_id)
        if run is None or run.watcher is None or run.watcher.done():
            return
        if run.stop_phase is None:
            run.stop_phase = phase
        self._kill(run, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(run.watcher), timeout=grace_s)
        except TimeoutError:
            self._kill(run, signal.SIGKILL)
            await run.watcher

    async def adopt(self) -> dict[str, int]:
        # Processes do not outlive this runtime yet (close() ends them), so nothing to adopt.
        return {}

    def running(self) -> dict[str, int]:
        return {wid: run.launch.epoch for wid, run in self._runs.items()}

    async def close(self) -> None:
        """End every process this runtime started (it cannot re-adopt them after a restart)."""
        await asyncio.gather(
            *(self.stop(wid, 2.0, EventPhase.CANCELLED) for wid in list(self._runs)),
            return_exceptions=True,
        )

    def log_path(self, workload_id: str, epoch: int) -> Path:
        return self.log_dir / f"{workload_id}-e{epoch}.log"

    async def _watch(self, run: _Run) -> None:
        launch = run.launch
        limit = launch.spec.max_runtime_s
        waits = [asyncio.create_task(p.wait()) for p in run.procs]
        exit_code: int | None = None
        reason = ""
        try:
            pending = set(waits)
            deadline = None if limit is None else asyncio.get_running_loop().time() + limit
            while pending:
                timeout = None if deadline is None else deadline - asyncio.get_running_loop().time()
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:  # max runtime reached
                    reason = "max_runtime_exceeded"
                    self._kill(run, signal.SIGKILL)
                    continue
                failed = [t.result() for t in done if t.result() != 0]
                if failed and exit_code is None:
                    exit_code = failed[0]
                    self._kill(run, signal.SIGTERM)  # one rank failed: the gang fails
            if exit_code is None:
                exit_code = 0 if not reason else -signal.SIGKILL
        finally:
            for task in waits:
                task.cancel()
        self._runs.pop(launch.workload_id, None)
        if run.stop_phase is not None:
            phase, reason = run.stop_phase, reason or run.stop_reason
        elif exit_code == 0 and not reason:
            phase = EventPhase.SUCCEEDED
        else:
            phase = EventPhase.FAILED
            if not reason:
                reason = _signal_name(exit_code) if exit_code < 0 else "exit_code"
        log_path = self.log_path(launch.workload_id, launch.epoch)
        log.info(
            "process_ended", workload=launch.workload_id, phase=phase.value, exit_code=exit_code
        )
        await self._sink(
            RuntimeEvent(
                launch.workload_id,
                launch.epoch,
                phase,
                exit_code=exit_code,
                reason=reason,
                message=f"exit code {exit_code}; log {log_path}",
            )
        )

    def _kill(self, run: _Run, sig: signal.Signals) -> None:
        for proc in run.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)


def _environment(launch: Launch, rank: int) -> dict[str, str]:
    assignment = launch.assignments[rank]
    env = dict(os.environ)
    env.update(launch.spec.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(d) for d in assignment.devices),
            "GPUFED_WORKLOAD_ID": launch.workload_id,
            "GPUFED_EPOCH": str(launch.epoch),
            "GPUFED_NODE": assignment.node,
            "GPUFED_NODE_RANK": str(rank),
            "GPUFED_NUM_NODES": str(len(launch.assignments)),
        }
    )
    if assignment.fraction is not None:
        env["GPUFED_GPU_FRACTION"] = f"{assignment.fraction:g}"
    return env


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal_{-code}"
