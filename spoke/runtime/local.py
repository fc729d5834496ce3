"""Run workloads as local processes: one per assigned node, pinned with CUDA_VISIBLE_DEVICES.

Each process runs in its own session (so a stop reaches its children) under a one-line shell
wrapper that records its exit code (spoke.runtime.exitlog): a restarted spoke re-adopts
processes that are still running from their run files and learns how the others ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from bus.ports import free_port
from schemas import Assignment, EventPhase, RuntimeCapabilities, WorkloadSpec
from spoke.errors import SpokeError
from spoke.fencing import Guard
from spoke.ports import EventSink, Launch, LogChunk, RuntimeEvent
from spoke.relay import PortRelay, url_of
from spoke.runtime.exitlog import ExitLog
from spoke.runtime.leftovers import Leftovers, log_name, log_of
from spoke.runtime.processes import alive, end_reason, exit_file, find_wrappers, until_groups_end
from spoke.runtime.retention import Keep
from spoke.runtime.runas import RunAs
from spoke.runtime.runjournal import RunJournal
from spoke.runtime.spawn import Child, spawn, spawn_as
from spoke.runtime.watchdog import keeper
from spoke.runtime.wrapper import INHERITED_ENV, WRAPPER, WRAPPER_LOGGED, environment

log = structlog.get_logger(__name__)

#: How often adopted processes (not our children) are checked.
ADOPTED_POLL_S = 0.5
#: Longest a run of starts holds the event loop before the rest of the spoke gets a turn (to
#: reap exits and publish events): a batch of 64 Places held it ~0.1 s on a busy machine.
START_TURN_S = 0.01


@dataclass
class _Run:
    launch: Launch
    procs: list[Child | asyncio.subprocess.Process] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)  # adopted runs have pids, not procs
    stop_phase: EventPhase | None = None
    stop_reason: str = ""
    watcher: asyncio.Task[None] | None = None
    port: int | None = None  # a session's or service's own port ($GPUFED_PORT, on 127.0.0.1)
    public_port: int | None = None  # where its relay listens (the reported URL's port)
    relay: PortRelay | None = None
    exits: int | None = None  # its exit log's generation; None: an exit file per process


class LocalRuntime:
    """Subprocess per workload (per node of a gang), logs to one file per workload and epoch.

    Each process starts in its own session so a stop reaches its children too. A session or
    service gets a port of its own on 127.0.0.1 ($GPUFED_PORT) that a relay (spoke.relay) on
    `expose_host` fronts: the relay's address is the URL reported with RUNNING, and it notes
    when the port last carried traffic.
    """

    def __init__(
        self,
        sink: EventSink,
        log_dir: Path,
        run_dir: Path | None = None,
        load_dir: Path | None = None,
        expose_host: str = "127.0.0.1",
        url_host: str | None = None,
        work_dir: Path | None = None,
        run_as: RunAs | None = None,
        keep: Keep | None = None,
        guard: Guard | None = None,
    ) -> None:
        self._sink = sink
        # A workload without a working_dir starts in work_dir/<id>, never in the spoke's own
        # working directory (under `gpufed up`, the one holding the data dir and its secrets).
        self.work_dir = work_dir or log_dir.parent / "work"
        self.run_as = run_as
        self.expose_host = expose_host
        # The host name in reported URLs: the expose host unless that is a wildcard address.
        self.url_host = url_host or expose_host
        self.log_dir = log_dir
        self.run_dir = run_dir or log_dir.parent / "runs"
        self.load_dir = load_dir or log_dir.parent / "load"  # simulated GPU load (telemetry)
        self._runs: dict[str, _Run] = {}
        self._journal = RunJournal(self.run_dir / "runs.jsonl")
        # Outlives the spoke to fence its movable work (spoke.runtime.watchdog).
        self._keeper = keeper(guard, self.run_dir, self._journal.path, log_dir)
        self._exits = ExitLog(self.run_dir)
        # An ended workload's log, workspace and load file: kept by `keep`, then removed.
        self.leftovers = Leftovers(
            keep or Keep(), log_dir, self.work_dir, self.load_dir, lambda: self._runs
        )
        self._devnull: int | None = None  # every workload's stdin
        self._dirs_made = False
        self._turn_at = 0.0  # when a start last let the event loop run the rest of the spoke
        # Folder names as text: a start joins several paths, and pathlib's joins cost more.
        self._log_prefix = f"{log_dir}{os.sep}"
        self._run_prefix = f"{self.run_dir}{os.sep}"
        self._load_prefix = f"{self.load_dir}{os.sep}"
        # Read once: os.environ decodes each variable on every read.
        self._inherited = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}

    async def start(self, launch: Launch) -> None:
        current = self._runs.get(launch.workload_id)
        if current is not None:
            if current.launch.epoch >= launch.epoch:
                return  # already started under this (or a newer) assignment
            await self.stop(launch.workload_id, 0.0, EventPhase.PREEMPTED)
        run = _Run(launch)
        self._runs[launch.workload_id] = run
        self.leftovers.started(launch.workload_id)
        if not self._dirs_made:  # once per spoke process, not three syscalls per start
            for folder in (self.log_dir, self.run_dir, self.load_dir):
                folder.mkdir(parents=True, exist_ok=True)
            self._dirs_made = True
        if self._devnull is None:
            # stdin, and stdout until the wrapper has opened the log
            self._devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        log_path = self._log_prefix + log_name(launch.workload_id, launch.epoch)
        if launch.spec.kind.exposes_port:
            run.port = free_port()
        master = free_port() if len(launch.assignments) > 1 else None  # a gang's rendezvous
        if self.leftovers.removing(launch.workload_id):  # started again as its files go
            await self.leftovers.settled()
        # A workspace the spoke has just made needs no check that it exists and may be entered.
        cwd, check_cwd = launch.spec.working_dir, True
        if cwd is None:
            cwd, check_cwd = self._workspace(launch), False
        if self.run_as is None:  # another user keeps an exit file of its own (exitlog)
            run.exits = self._exits.begin()
        # Recorded before the first process exists: a spoke killed between the spawn and the
        # pids' record still finds its processes on restart (by their exit files' paths).
        self._journal.start(launch, run.port, run.exits)
        try:
            for rank in range(len(launch.assignments)):
                env = environment(launch, rank, self._inherited, master)
                env["GPUFED_LOAD_FILE"] = f"{self._load_prefix}{launch.workload_id}.load"
                options = self._as_user(env, launch, rank)
                if run.port is not None and rank == 0:
                    env["GPUFED_HOST"], env["GPUFED_PORT"] = "127.0.0.1", str(run.port)
                exit_file = self._exit_path(launch, rank)
                command = launch.spec.command
                proc: Child | asyncio.subprocess.Process
                if options:  # another user's identity: Popen can setuid, posix_spawn not
                    # The log is the spoke's file (that user may not write in the log folder).
                    with open(log_path, "ab") as out:  # noqa: ASYNC230
                        argv = ["/bin/sh", "-c", WRAPPER, exit_file, *command]
                        proc = await spawn_as(argv, env, out.fileno(), cwd, options)
                else:
                    assert run.exits is not None
                    exits = self._exits.path(run.exits)
                    argv = ["/bin/sh", "-c", WRAPPER_LOGGED, exit_file, exits, log_path, cwd]
                    argv += command
                    checked = cwd if check_cwd else None
                    proc = spawn(argv, env, self._devnull, self._devnull, checked)
                run.procs.append(proc)  # its pid is in process_ended
        except OSError as exc:
            # The command cannot run (not found, not executable, bad working dir): the
            # workload fails like a shell's 127, it is not the spoke's fault.
            self._kill(run, signal.SIGKILL)
            del self._runs[launch.workload_id]
            self._end(run)
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
        run.pids = [p.pid for p in run.procs]
        self._journal.pids(launch, run.pids)
        if launch.spec.fenced:
            self._keeper.fenced_run(self._inherited)
        endpoint = await self._expose(run)
        await self._sink(
            RuntimeEvent(launch.workload_id, launch.epoch, EventPhase.RUNNING, endpoint=endpoint)
        )
        run.watcher = asyncio.create_task(self._watch(run), name=f"watch-{launch.workload_id}")
        if time.monotonic() - self._turn_at > START_TURN_S:
            await asyncio.sleep(0)
            self._turn_at = time.monotonic()

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
        """Watch again the processes a previous spoke process started; report those that ended."""
        adopted: dict[str, int] = {}
        fenced = self._keeper.adopting()  # stopped by the watchdog while no spoke ran
        for run in self._replay_journal():
            wid = run.launch.workload_id
            self._runs[wid] = run
            if (wid, run.launch.epoch) in fenced:
                run.stop_phase, run.stop_reason = EventPhase.PREEMPTED, "fenced"
            if run.exits is not None:
                self._exits.adopted(run.exits)
            if any(alive(pid, wid) for pid in run.pids):
                adopted[wid] = run.launch.epoch
                log.info("process_adopted", workload=wid, pids=run.pids)
                await self._expose(run)  # the same URL as before, where its port is still free
                if run.launch.spec.fenced:
                    self._keeper.fenced_run(self._inherited)
            run.watcher = asyncio.create_task(self._watch(run), name=f"watch-{wid}")
        self._exits.prune()
        self.leftovers.watch()
        return adopted

    def capabilities(self) -> RuntimeCapabilities:
        """Fractions and gangs (one process per node), but no MIG slices: it has no driver."""
        return RuntimeCapabilities(mig=False)

    def running(self) -> dict[str, int]:
        return {wid: run.launch.epoch for wid, run in self._runs.items()}

    def quiet_s(self, workload_id: str) -> float | None:
        """Seconds since a session's or service's port last carried traffic; None: no port."""
        run = self._runs.get(workload_id)
        return run.relay.quiet_s() if run is not None and run.relay is not None else None

    def endpoint(self, workload_id: str) -> str:
        """The URL a session or service is reached at ("" for a job or an unknown workload)."""
        run = self._runs.get(workload_id)
        if run is None or run.public_port is None:
            return ""
        return url_of(self.url_host, workload_id, run.public_port)

    async def _expose(self, run: _Run) -> str:
        """Start the relay in front of the run's port; its URL ("" when it has no port)."""
        if run.port is None:
            return ""
        relay = PortRelay(self.expose_host, run.port)
        try:
            run.public_port = await relay.start(run.public_port or 0)
        except OSError as exc:  # an adopted run's old port was taken meanwhile
            log.warning("relay_port_taken", workload=run.launch.workload_id, error=str(exc))
            run.public_port = await relay.start(0)
        run.relay = relay
        self._journal.port(run.launch, run.public_port)
        return self.endpoint(run.launch.workload_id)

    async def close(self) -> None:
        """Stop watching; the processes run on and a restarted spoke re-adopts them."""
        self._keeper.close()
        await self.leftovers.close()
        for run in self._runs.values():
            if run.relay is not None:
                await run.relay.close()
        watchers = [r.watcher for r in self._runs.values() if r.watcher is not None]
        for watcher in watchers:
            watcher.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        for run in self._runs.values():
            for proc in run.procs:
                if isinstance(proc, Child):
                    proc.detach()
        if self._devnull is not None:
            os.close(self._devnull)
            self._devnull = None
        self._journal.close()

    def log_path(self, workload_id: str, epoch: int) -> Path:
        return self.log_dir / log_name(workload_id, epoch)

    def read_log(
        self, workload_id: str, epoch: int | None, offset: int | None, max_bytes: int
    ) -> LogChunk:
        path = self.log_path(workload_id, epoch) if epoch is not None else None
        run = self._runs.get(workload_id)
        if run is not None and (epoch is None or epoch == run.launch.epoch):
            epoch = run.launch.epoch
            path = self.log_path(workload_id, epoch)
            if not path.exists():  # started, its wrapper not yet at the line that creates it
                return LogChunk(b"", 0, 0, 0, epoch)
        if path is None or not path.exists():
            # The latest epoch that ran here (a requeued workload's new epoch may not have).
            named = (log_of(p.name) for p in self.log_dir.glob(f"{workload_id}-e*.log"))
            epochs = sorted(n[1] for n in named if n is not None and n[0] == workload_id)
            if not epochs:  # never ran here, or ended long enough ago to be removed
                raise SpokeError(
                    f"no log of workload {workload_id} on this spoke (an ended workload's log "
                    f"is kept {self.leftovers.ended_runs.keep.describe()})"
                )
            epoch = epochs[-1]
            path = self.log_path(workload_id, epoch)
        assert epoch is not None
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - max_bytes) if offset is None else min(offset, size)
            f.seek(start)
            data = f.read(min(max_bytes, size - start))
        return LogChunk(data, start, start + len(data), size, epoch)

    async def _watch(self, run: _Run) -> None:
        launch = run.launch
        if run.procs:
            exit_code, reason = await self._wait_children(run)
            await until_groups_end([p.pid for p in run.procs])  # each leads its own group
        else:
            exit_code, reason = await self._wait_adopted(run)
        self._runs.pop(launch.workload_id, None)
        if run.relay is not None:
            await run.relay.close()
        self._end(run)
        if run.stop_phase is not None:
            phase, reason = run.stop_phase, run.stop_reason or reason
        elif exit_code == 0 and not reason:
            phase = EventPhase.SUCCEEDED
        else:
            phase = EventPhase.FAILED
            reason = reason or end_reason(exit_code)
        log_path = self._log_prefix + log_name(launch.workload_id, launch.epoch)
        log.info(  # the one line per workload
            "process_ended",
            workload=launch.workload_id,
            pids=run.pids,
            phase=phase.value,
            exit_code=exit_code,
        )
        message = f"exit code {exit_code}; log {log_path}"
        if reason in ("command_not_found", "not_executable"):
            message = (
                f"cannot run {launch.spec.command[0]!r}: {reason.replace('_', ' ')}; {message}"
            )
        elif reason == "max_runtime_exceeded":
            message = f"killed at its max_runtime_s ({launch.spec.max_runtime_s} s); {message}"
        await self._sink(
            RuntimeEvent(
                launch.workload_id,
                launch.epoch,
                phase,
                exit_code=exit_code,
                reason=reason,
                message=message,
            )
        )

    async def _wait_children(self, run: _Run) -> tuple[int | None, str]:
        limit = run.launch.spec.max_runtime_s
        if limit is None and len(run.procs) == 1:
            # The common case, without a task per process and a wait over them: one process
            # and no time limit ends the run when it ends (nothing else of it to stop).
            return await run.procs[0].wait(), ""
        loop = asyncio.get_running_loop()
        waits = [asyncio.create_task(p.wait()) for p in run.procs]
        exit_code: int | None = None
        reason = ""
        try:
            pending = set(waits)
            deadline = None if limit is None else loop.time() + limit
            while pending:
                timeout = None if deadline is None else max(0.0, deadline - loop.time())
                done, pending = await asyncio.wait(
                    pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:  # max runtime reached
                    reason, deadline = "max_runtime_exceeded", None
                    self._kill(run, signal.SIGKILL)
                    continue
                failed = [t.result() for t in done if t.result() != 0]
                if failed and exit_code is None:
                    exit_code = failed[0]
                    self._kill(run, signal.SIGTERM)  # one rank failed: the gang fails
        finally:
            for task in waits:
                task.cancel()
        if exit_code is None:
            exit_code = 0 if not reason else -signal.SIGKILL
        return exit_code, reason

    async def _wait_adopted(self, run: _Run) -> tuple[int | None, str]:
        # Not our children: poll until they are gone, then read the codes they left.
        wid = run.launch.workload_id
        while any(alive(pid, wid) for pid in run.pids):  # noqa: ASYNC110 - no event to wait on
            await asyncio.sleep(ADOPTED_POLL_S)
        codes = [self._exit_code(run, rank) for rank in range(len(run.launch.assignments))]
        if None in codes:
            return None, "exit_unknown"  # killed with its wrapper while the spoke was away
        failed = [c for c in codes if c != 0]
        return (failed[0] if failed else 0), ""

    def _exit_code(self, run: _Run, rank: int) -> int | None:
        """The code rank's wrapper recorded: in the run's exit log, or in an exit file of its
        own (another user's run, or one a spoke of before the exit log started)."""
        path = self._exit_path(run.launch, rank)
        if run.exits is not None:
            return self._exits.code(run.exits, os.path.basename(path))
        try:
            with open(path, encoding="utf-8") as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def _kill(self, run: _Run, sig: signal.Signals) -> None:
        live = [p.pid for p in run.procs if p.returncode is None] if run.procs else run.pids
        for pid in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)  # each process leads its own session and group

    def _workspace(self, launch: Launch) -> str:
        path = f"{self.work_dir}{os.sep}{launch.workload_id}"
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # a workload started again keeps its folder
        except FileNotFoundError:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            os.mkdir(path, 0o700)
        if self.run_as is not None:
            self.run_as.give(Path(path))
        return path

    def _as_user(self, env: dict[str, str], launch: Launch, rank: int) -> dict[str, Any]:
        """With `run_as`: its identity in `env`, the files its wrapper and telemetry write
        made its own, and the spawn options that start it as that user."""
        if self.run_as is None:
            return {}
        env.update(self.run_as.environment())
        for path in (self._exit_file(launch, rank), Path(env["GPUFED_LOAD_FILE"])):
            path.touch()  # empty: read as "no exit code" / "no load reported" until written
            self.run_as.give(path)
        return self.run_as.spawn_options()

    def _exit_file(self, launch: Launch, rank: int) -> Path:
        return Path(self._exit_path(launch, rank))

    def _exit_path(self, launch: Launch, rank: int) -> str:
        return exit_file(self._run_prefix, launch.workload_id, launch.epoch, rank)

    @property
    def journal_path(self) -> Path:
        return self._journal.path

    def _end(self, run: _Run) -> None:
        launch = run.launch
        self._journal.end(launch)
        self.leftovers.ended(launch.workload_id, launch.epoch)
        if run.exits is not None:
            self._exits.end(run.exits)
            return
        for rank in range(len(launch.assignments)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._exit_path(launch, rank))

    def _replay_journal(self) -> list[_Run]:
        """Runs started and not ended, from runs.jsonl (which is rewritten to just those)."""
        runs = []
        for record in self._journal.replay():
            try:
                run = _run_from_file(record)
                if not run.pids:  # killed between spawn and the pids' record: look them up
                    run.pids = find_wrappers(
                        [self._exit_path(run.launch, r) for r in range(len(run.launch.assignments))]
                    )
                runs.append(run)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("run_record_unreadable", error=str(exc))
        return runs


def _run_from_file(data: dict[str, Any]) -> _Run:
    launch = Launch(
        workload_id=data["workload_id"],
        epoch=int(data["epoch"]),
        decision_id=data["decision_id"],
        spec=WorkloadSpec.model_validate(data["spec"]),
        assignments=tuple(Assignment.model_validate(a) for a in data["assignments"]),
    )
    port, public, exits = data.get("port"), data.get("pub"), data.get("x")
    return _Run(
        launch=launch,
        pids=[int(p) for p in data["pids"]],
        port=None if port is None else int(port),
        public_port=None if public is None else int(public),
        exits=None if exits is None else int(exits),
    )
