"""Local provisioner: a "cloud instance" is a `gpufed spoke --kind cloud` process on this machine.

For the embedded demo, the bench and tests. Each instance gets a static inventory of one node
with the instance type's GPUs (simulated) and runs the local runtime. What was started is kept
in `<state_dir>/instances.json` (pid, offer, launch time), so a restarted controller finds its
processes again; a process counts as alive only while its pid exists *and* its
`/proc/<pid>/cmdline` carries `--id <burst id>` (a reused pid is not ours). Processes are
stopped by their recorded pid, never by name.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog
import yaml

from burst.catalog import Catalog
from burst.errors import PermanentBurstError, RetryableBurstError
from burst.ports import InstanceInfo, LaunchRequest
from bus import lifeline
from bus.authority import write_secret
from schemas.burst import InstanceState, Market

log = structlog.get_logger(__name__)

PROVIDER = "local"
STATE_FILE = "instances.json"
#: Records of ended instances are kept this long (a later launch of the id stays a no-op).
KEEP_ENDED_S = 24 * 3600.0


@dataclass(slots=True)
class _Record:
    """One launched process as the state file stores it."""

    burst_id: str
    pid: int
    instance_type: str
    region: str
    market: str
    team: str
    price_per_hour: float
    gpu_model: str
    gpu_count: int
    launched_at: float
    log: str
    stopping: bool = False
    ended_at: float | None = None


class LocalProvider:
    """Provisioner whose instances are local spoke processes (see burst.ports.Provisioner)."""

    def __init__(
        self,
        state_dir: Path,
        nats_url: str,
        catalog: Catalog,
        python: str = sys.executable,
        heartbeat_s: float = 1.0,
        *,
        stop_grace_s: float = 15.0,
        clock: Callable[[], float] = time.time,
        nats_ca: Path | None = None,
    ) -> None:
        self.state_dir = Path(state_dir).resolve()
        self.nats_url = nats_url
        self.catalog = catalog
        self.python = python
        self.heartbeat_s = heartbeat_s
        self.stop_grace_s = stop_grace_s
        self.nats_ca = nats_ca
        self._clock = clock
        self._lock = asyncio.Lock()
        # Handles of the processes this object started: polling them reaps exited children.
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def name(self) -> str:
        return PROVIDER

    async def launch(self, request: LaunchRequest) -> InstanceInfo:
        """Start the spoke process of `request.burst_id` (idempotent: a known id starts nothing).

        Returns at once with the instance RUNNING (the process is up; its spoke joins the hub a
        moment later). Raises PermanentBurstError for an instance type the catalog lacks.
        """
        async with self._lock:
            records = self._load()
            known = records.get(request.burst_id)
            if known is not None:
                info = self._info(known)
                log.info("burst_launch_reused", burst_id=request.burst_id, state=info.state)
                return info
            spec = self.catalog.get(request.instance_type)
            if spec is None:
                raise PermanentBurstError(
                    f"instance type {request.instance_type} is not in the catalog"
                )
            # fork/exec and file writes off the event loop
            record = await asyncio.to_thread(self._start, request, spec.gpu_model, spec.gpu_count)
            records[record.burst_id] = record
            self._save(records)
        log.info(
            "burst_instance_launched",
            burst_id=record.burst_id,
            pid=record.pid,
            instance_type=record.instance_type,
            gpus=record.gpu_count,
            gpu_model=record.gpu_model,
            team=record.team,
        )
        return self._info(record)

    async def renew_credentials(self, burst_id: str, creds: str) -> None:
        """Replace a running instance's NATS credential (its spoke reconnects with it)."""
        path = self.state_dir / "creds" / f"{burst_id}.creds"
        try:
            await asyncio.to_thread(write_secret, path, creds)
        except OSError as exc:
            raise RetryableBurstError(f"cannot renew {burst_id}'s credential: {exc}") from exc

    async def describe(self, burst_ids: Sequence[str]) -> list[InstanceInfo]:
        """The recorded instances of these ids, alive or not; unknown ids are left out."""
        async with self._lock:
            records = self._load()
        wanted = set(burst_ids)
        return [self._info(r) for key, r in sorted(records.items()) if key in wanted]

    async def terminate(self, burst_ids: Sequence[str]) -> list[InstanceInfo]:
        """SIGTERM each live process, SIGKILL it after the grace; unknown or ended ids: no-op.

        Waits (without blocking the loop) until the processes are gone, at most the grace
        plus a moment. Returns the instances it stopped, as they were before.
        """
        async with self._lock:
            records = self._load()
            victims = [
                records[key]
                for key in sorted(set(burst_ids))
                if key in records and self._alive(records[key])
            ]
            for record in victims:
                record.stopping = True
            self._save(records)
        before = [self._info(record) for record in victims]
        await asyncio.gather(*(self._stop(record) for record in victims))
        async with self._lock:
            records = self._load()
            now = self._clock()
            for record in victims:
                if record.burst_id in records:
                    records[record.burst_id].ended_at = now
                    records[record.burst_id].stopping = True
            self._save(records)
        return before

    async def sweep_orphans(
        self, known_burst_ids: Collection[str], now: float, grace_s: float
    ) -> list[InstanceInfo]:
        """Stop live recorded processes whose id is not known and that are older than grace."""
        async with self._lock:
            records = self._load()
        known = set(known_burst_ids)
        orphans = [
            r.burst_id
            for r in records.values()
            if r.burst_id not in known and now - r.launched_at > grace_s and self._alive(r)
        ]
        stopped = await self.terminate(orphans)
        for info in stopped:
            log.warning(
                "burst_orphan_terminated",
                burst_id=info.burst_id,
                pid=info.provider_instance_id,
                age_s=round(now - (info.launched_at or now)),
            )
        return stopped

    def close(self) -> None:
        """Forget our child handles (reaping the exited ones); processes keep running."""
        for proc in self._procs.values():
            proc.poll()
        self._procs.clear()

    # -- helpers ---------------------------------------------------------------------------

    def _start(self, request: LaunchRequest, gpu_model: str, gpu_count: int) -> _Record:
        inventories = self.state_dir / "inventories"
        logs = self.state_dir / "logs"
        inventories.mkdir(parents=True, exist_ok=True)
        logs.mkdir(parents=True, exist_ok=True)
        inventory = inventories / f"{request.burst_id}.yaml"
        node = {
            "prefix": f"{request.burst_id}-n",
            "count": 1,
            "gpu_model": gpu_model,
            "gpu_count": gpu_count,
        }
        inventory.write_text(yaml.safe_dump({"nodes": [node]}), encoding="utf-8")
        price_per_gpu_hour = request.price_per_hour / max(gpu_count, 1)
        nats_flags: list[str] = []
        if request.spoke_creds is not None:
            # The instance's own credential, as a file only its owner reads (never argv).
            creds = write_secret(
                self.state_dir / "creds" / f"{request.burst_id}.creds", request.spoke_creds
            )
            nats_flags += ["--nats-creds", str(creds)]
        if self.nats_ca is not None:
            nats_flags += ["--nats-ca", str(self.nats_ca)]
        command = [
            self.python, "-m", "gpufed", "spoke",
            "--id", request.burst_id,
            "--region", request.region,
            "--kind", "cloud",
            "--nats-url", self.nats_url,
            *nats_flags,
            "--inventory", f"static:{inventory}",
            "--runtime", "local",
            "--state-dir", str(self.state_dir / "spokes"),
            "--heartbeat", f"{self.heartbeat_s:g}",
            "--stop-workloads-on-exit",
            "--price", f"{price_per_gpu_hour:.6g}",
            "--label", f"instance-type={request.instance_type}",
            "--label", f"burst-team={request.team}",
            "--label", f"market={request.market.value}",
        ]  # fmt: skip
        log_path = logs / f"{request.burst_id}.log"
        try:
            with open(log_path, "ab") as log_file:
                # Its own session: a Ctrl-C meant for the controller does not reach the
                # "cloud machine", which outlives a controller restart as a real one would.
                # It ends with `gpufed up`'s lifeline, if this controller was handed one.
                handed = lifeline.handing(lifeline.passed())
                proc = subprocess.Popen(
                    command,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    pass_fds=handed.pass_fds,
                    env=handed.env,
                )
        except OSError as exc:
            raise RetryableBurstError(f"cannot start spoke {request.burst_id}: {exc}") from exc
        _wait_for_cmdline(proc)
        self._procs[request.burst_id] = proc
        return _Record(
            burst_id=request.burst_id,
            pid=proc.pid,
            instance_type=request.instance_type,
            region=request.region,
            market=request.market.value,
            team=request.team,
            price_per_hour=request.price_per_hour,
            gpu_model=gpu_model,
            gpu_count=gpu_count,
            launched_at=self._clock(),
            log=str(log_path),
        )

    async def _stop(self, record: _Record) -> None:
        self._signal(record, signal.SIGTERM)
        if not await self._gone_within(record, self.stop_grace_s):
            log.warning("burst_instance_killed", burst_id=record.burst_id, pid=record.pid)
            self._signal(record, signal.SIGKILL)
            await self._gone_within(record, 5.0)
        log.info("burst_instance_stopped", burst_id=record.burst_id, pid=record.pid)

    async def _gone_within(self, record: _Record, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._alive(record):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def _signal(self, record: _Record, sig: signal.Signals) -> None:
        # Checked right before, and only a process known to be ours: never a reused pid.
        if not self._alive(record, known_ours=True):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, sig)

    def _alive(self, record: _Record, known_ours: bool = False) -> bool:
        """Whether the instance's process has not ended yet. Without our handle on it (a
        provider started after it), from /proc: a process between two programs (its
        arguments not there yet, or not any more as it exits) counts as not ended, unless
        `known_ours` (to signal it) is asked."""
        proc = self._procs.get(record.burst_id)
        if proc is not None and proc.pid == record.pid:
            return proc.poll() is None
        try:
            cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes()
            stat = "" if cmdline else Path(f"/proc/{record.pid}/stat").read_text()
        except OSError:
            return False
        ours = running_as(record.burst_id, cmdline, stat)
        return ours is True or (ours is None and not known_ours)

    def _info(self, record: _Record) -> InstanceInfo:
        if self._alive(record):
            state = InstanceState.TERMINATING if record.stopping else InstanceState.RUNNING
        else:
            state = InstanceState.TERMINATED
        return InstanceInfo(
            burst_id=record.burst_id,
            provider=PROVIDER,
            provider_instance_id=f"pid-{record.pid}",
            instance_type=record.instance_type,
            region=record.region,
            zone=f"{record.region}-local",
            market=Market(record.market),
            team=record.team,
            state=state,
            launched_at=record.launched_at,
            price_per_hour=record.price_per_hour,
            gpu_model=record.gpu_model,
            gpu_count=record.gpu_count,
        )

    def _load(self) -> dict[str, _Record]:
        path = self.state_dir / STATE_FILE
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise PermanentBurstError(f"{path}: unreadable local provider state: {exc}") from exc
        return {key: _Record(**value) for key, value in data.get("instances", {}).items()}

    def _save(self, records: dict[str, _Record]) -> None:
        now = self._clock()
        for record in records.values():
            if record.ended_at is None and not self._alive(record):
                record.ended_at = now  # exited on its own (crashed, or killed by someone)
        kept = {
            key: asdict(r)
            for key, r in sorted(records.items())
            if r.ended_at is None or now - r.ended_at < KEEP_ENDED_S
        }
        self.state_dir.mkdir(parents=True, exist_ok=True)
        path = self.state_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"instances": kept}, indent=1), encoding="utf-8")
        os.replace(tmp, path)  # atomic: a crash leaves the old file or the new one


#: A kernel thread's flag in /proc/PID/stat: it never has a command line.
_PF_KTHREAD = 0x00200000


def running_as(burst_id: str, cmdline: bytes, stat: str) -> bool | None:
    """Whether the process of /proc/PID/`cmdline` (and, when that is empty, /proc/PID/`stat`)
    is the spoke of `burst_id`: True; another program (a reused pid), a zombie or a kernel
    thread: False; None for one between two programs, whose arguments are not there yet
    (exec under way) or not any more (it is exiting, its memory already given back): not
    ended, but not known to be ours either."""
    if cmdline:
        args = cmdline.split(b"\0")
        wanted = burst_id.encode()
        return any(a == b"--id" and b == wanted for a, b in itertools.pairwise(args))
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 7 or fields[0] in ("Z", "X") or int(fields[6]) & _PF_KTHREAD:
        return False
    return None


def _wait_for_cmdline(proc: subprocess.Popen[bytes], limit_s: float = 2.0) -> None:
    """Until the child's /proc cmdline shows its arguments (blocking: run in a thread).

    Popen returns once exec has begun, but the kernel sets the new program's arguments a
    moment later; until then /proc/<pid>/cmdline is empty, which `_alive` (of this provider
    or of one started after it) would read as a dead process.
    """
    deadline = time.monotonic() + limit_s
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                return
        except OSError:
            return  # no /proc here: nothing to wait for
        time.sleep(0.002)
