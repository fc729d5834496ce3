"""When the spoke is gone, its lease still ends its movable work (local runtime).

While a spoke runs, it stops the work the hub would move once it has not heard the hub for
fence_after (`spoke.fencing`), before the hub, after lost_after, runs that work elsewhere. A
spoke process stopped for good, or crashed and not brought back, or failing at every start,
stops nothing: its workloads would run on, and the hub's copies beside them.

So the local runtime keeps a watchdog beside the spoke: one process per spoke, in a session of
its own, started with the first fenced run (`WorkloadSpec.fenced`). While the spoke lives (the
watchdog's parent, and the `alive` marker the runtime keeps until it closes) it only looks.
Once the spoke is gone, it applies the spoke's own rule, read from the spoke's own state
(`Fence` over fence.json: the hub last heard, its lost_after, the work kept running): past
fence_after it stops each fenced run still open in runs.jsonl as the spoke would, SIGTERM to
each of its process groups, then SIGKILL after the stop grace. While the spoke lives it costs
two system calls every POLL_S; it exits once the spoke is gone and no fenced run is left, or
when the spoke's folder is gone. A spoke that starts again stops the old watchdog (its pid
file) before it adopts the runs, and starts its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import structlog

from schemas import WorkloadSpec
from spoke.fencing import STOPPED_WITHOUT_SPOKE, Guard
from spoke.runtime.leftovers import log_name
from spoke.runtime.processes import alive, exit_file, find_wrappers
from spoke.runtime.runjournal import read_open
from spoke.runtime.spawn import Child, spawn

log_ = structlog.get_logger(__name__)

#: How often the watchdog looks.
POLL_S = 0.5
_LOG_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT
#: The runs a watchdog stopped ("<workload> <epoch>" lines): a spoke that comes back reports
#: them preempted (fenced), not failed with an unknown exit.
FENCED_FILE = "fenced-by-watchdog.txt"
#: The module the watchdog runs as (`python -m`), how a spoke tells its own from others'.
MODULE = "spoke.runtime.watchdog"


def keeper(guard: Guard | None, run_dir: Path, journal: Path, log_dir: Path) -> Keeper | Unguarded:
    """The local runtime's keeper of its watchdog: none without a `guard` (a runtime made
    without a spoke's settings, as in tests of the runtime alone)."""
    return Unguarded() if guard is None else Keeper(guard, run_dir, journal, log_dir)


class Unguarded:
    """A runtime without a watchdog: nothing outlives its spoke."""

    def adopting(self) -> set[tuple[str, int]]:
        return set()

    def fenced_run(self, env: dict[str, str]) -> None:
        pass

    def close(self) -> None:
        pass


class Keeper:
    """The local runtime's side: starts the watchdog, keeps the `alive` marker, and stops a
    watchdog an earlier spoke process left (files in `run_dir`)."""

    def __init__(self, guard: Guard, run_dir: Path, journal: Path, log_dir: Path) -> None:
        self.guard = guard
        self.journal = journal
        self.log_dir = log_dir  # the workloads' logs: a fenced one's says why it stopped
        self.alive_path = run_dir / "spoke.alive"
        self.pid_path = run_dir / "watchdog.pid"
        self._child: Child | None = None

    def adopting(self) -> set[tuple[str, int]]:
        """A spoke starts (before it adopts its runs): the previous one's watchdog goes; the
        runs it stopped meanwhile, (workload, epoch), are returned (and forgotten here)."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pid_path.read_text())
            if _is_watchdog(pid, self.journal):
                os.kill(pid, signal.SIGKILL)
        self.pid_path.unlink(missing_ok=True)
        fenced: set[tuple[str, int]] = set()
        noted = self.journal.parent / FENCED_FILE
        with contextlib.suppress(FileNotFoundError):
            for line in noted.read_text(encoding="utf-8").splitlines():
                wid, _, epoch = line.partition(" ")
                if epoch.isdigit():
                    fenced.add((wid, int(epoch)))
            noted.unlink()
        return fenced

    def fenced_run(self, env: dict[str, str]) -> None:
        """A fenced run started or was adopted: a watchdog is there to outlive the spoke."""
        g = self.guard
        if self._child is not None and self._child.returncode is None:
            return
        self.alive_path.touch()
        after = "-" if g.fence_after_s is None else repr(g.fence_after_s)
        argv = [
            sys.executable, "-m", MODULE, str(g.fence_path), str(self.journal),
            str(self.log_dir), str(self.alive_path), str(os.getpid()), repr(g.heartbeat_s),
            repr(g.stop_grace_s), after,
        ]  # fmt: skip
        if "PYTHONPATH" in os.environ:  # where the spoke found its own modules
            env = {**env, "PYTHONPATH": os.environ["PYTHONPATH"]}
        try:
            log = os.open(self.pid_path.with_suffix(".log"), _LOG_FLAGS, 0o600)
            devnull = os.open(os.devnull, os.O_RDONLY)
            try:
                self._child = spawn(argv, env, devnull, log)
            finally:
                os.close(log)
                os.close(devnull)
            self.pid_path.write_text(f"{self._child.pid}\n")
        except OSError as exc:  # the run goes on; only a spoke gone for good would miss it
            log_.warning("watchdog_not_started", error=str(exc))

    def close(self) -> None:
        """The spoke stops: its watchdog takes over (the marker goes; the process runs on)."""
        self.alive_path.unlink(missing_ok=True)
        if self._child is not None:
            self._child.detach()


def _is_watchdog(pid: int, journal: Path) -> bool:
    """Whether `pid` is a watchdog of the runs in `journal` (not a reused pid)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return MODULE.encode() in argv and str(journal).encode() in argv


def fenced_open_runs(journal: Path) -> dict[str, tuple[int, list[int]]]:
    """The fenced runs still open in `journal` whose processes live: id -> (epoch, pids)."""
    run_prefix = f"{journal.parent}{os.sep}"
    runs: dict[str, tuple[int, list[int]]] = {}
    for record in read_open(journal).values():
        try:
            if not WorkloadSpec.model_validate(record["spec"]).fenced:
                continue
            wid, epoch = record["workload_id"], int(record["epoch"])
            ranks = len(record["assignments"])
        except (KeyError, TypeError, ValueError):
            continue
        pids = [int(p) for p in record.get("pids") or []] or find_wrappers(
            [exit_file(run_prefix, wid, epoch, rank) for rank in range(ranks)]
        )
        pids = [pid for pid in pids if alive(pid, wid)]
        if pids:
            runs[wid] = (epoch, pids)
    return runs


def watch(guard: Guard, journal: Path, log_dir: Path, alive_path: Path, parent: int) -> int:
    """The watchdog's loop (see the module): 0 once nothing fenced is left to watch."""
    stopping: dict[str, float] = {}  # workload -> when it got SIGTERM
    while journal.parent.exists():
        if os.getppid() == parent and alive_path.exists():  # the spoke lives: two syscalls
            time.sleep(POLL_S)
            continue
        runs = fenced_open_runs(journal)  # the spoke is gone
        if not runs:
            return 0
        now = time.time()
        # The spoke's rule over its state as it left it (read each time: a spoke that came
        # back and went again may have heard the hub since).
        for wid in guard.read().to_stop(runs, now):
            if wid not in stopping:
                print(f"fencing {wid}: its spoke is gone, its lease ran out", flush=True)
                stopping[wid] = now
                epoch, pids = runs[wid]
                with open(journal.parent / FENCED_FILE, "a", encoding="utf-8") as noted:
                    noted.write(f"{wid} {epoch}\n")  # before the signal: the spoke reads it
                with (
                    contextlib.suppress(OSError),
                    open(log_dir / log_name(wid, epoch), "a", encoding="utf-8") as out,
                ):
                    out.write(f"{STOPPED_WITHOUT_SPOKE}\n")  # its owner reads why it ended
                _signal(pids, signal.SIGTERM)
        for wid, since in stopping.items():
            if wid in runs and now - since > guard.stop_grace_s:
                _signal(runs[wid][1], signal.SIGKILL)
        time.sleep(POLL_S)
    return 0


def _signal(groups: list[int], sig: signal.Signals) -> None:
    for pid in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)  # each wrapper leads its own process group


def main(argv: list[str]) -> int:
    fence_path, journal, log_dir, alive_path, parent, heartbeat, grace, after = argv
    guard = Guard(
        Path(fence_path),
        heartbeat_s=float(heartbeat),
        stop_grace_s=float(grace),
        fence_after_s=None if after == "-" else float(after),
    )
    return watch(guard, Path(journal), Path(log_dir), Path(alive_path), int(parent))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
