"""A real Slurm cluster on this machine: munged, slurmctld and one slurmd per node (`slurmd -N`).

Everything lives in one private directory: the munge key and socket, slurm.conf and gres.conf,
state, spool and log files, and eight plain files per node standing in for /dev/nvidia0-7
(gres.conf `AutoDetect=off` with `File=` registers them as `gpu:h100:8`). The daemons run in the
foreground as children of the test process, on free ports, and are stopped by their own
process handles. Every Slurm command finds this cluster through SLURM_CONF in its environment;
the machine's /etc/slurm is never read.

Every daemon listens on 127.0.0.1 only: SlurmctldHost and NodeAddr name 127.0.0.1, and
`CommunicationParameters=NoCtldInAddrAny,NoInAddrAny` makes slurmctld bind to its ControlAddr and
slurmd (and srun's own listening sockets) to the node's address instead of every interface;
munged listens on a socket file in the cluster's directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from bus.ports import free_port
from spoke.slurm import SlurmCli, base_environment

#: Program -> the Debian package it comes from.
PROGRAMS = {
    "munged": "munge",
    "slurmctld": "slurmctld (slurm-wlm)",
    "slurmd": "slurmd (slurm-wlm)",
    "sbatch": "slurm-client (slurm-wlm)",
    "squeue": "slurm-client (slurm-wlm)",
    "scontrol": "slurm-client (slurm-wlm)",
    "scancel": "slurm-client (slurm-wlm)",
    "srun": "slurm-client (slurm-wlm)",
}
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
GPU_TYPE = "h100"
GPUS_PER_NODE = 8


def missing_programs() -> list[str]:
    """The programs of PROGRAMS not installed here."""
    return [p for p in PROGRAMS if shutil.which(p, path=_SEARCH_PATH) is None]


def why_not_runnable() -> str | None:
    """Why a Slurm cluster cannot start on this machine (a line saying what to do), or None."""
    missing = missing_programs()
    if missing:
        packages = sorted({PROGRAMS[p].split(" ")[-1].strip("()") for p in missing})
        return (
            f"Slurm tests need {', '.join(missing)}: install Debian's "
            f"{' and '.join(packages)} (apt-get install slurm-wlm munge), or run `make test` as "
            "root, which installs them"
        )
    if os.geteuid() != 0:
        return "Slurm tests need root: slurmd starts every job as its submitting user"
    return None


class SlurmCluster:
    """munged + slurmctld + slurmd per node, in `root`, on free loopback ports."""

    def __init__(self, root: Path, nodes: tuple[str, ...] = ("n1", "n2")) -> None:
        self.root = root
        self.node_names = nodes
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "etc" / "slurm.conf"
        self.munge_socket = root / "run" / "munge.socket"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def environment(self) -> dict[str, str]:
        """What every Slurm command needs to reach this cluster (and nothing of the spoke's)."""
        return base_environment() | {"SLURM_CONF": str(self.conf)}

    def cli(self) -> SlurmCli:
        return SlurmCli(self.environment, timeout_s=20)

    def run(self, *args: str, input_text: str | None = None, check: bool = True) -> str:
        """A Slurm command against this cluster (for the tests' own set-up); fails the test on
        an error unless `check` is false."""
        result = subprocess.run(
            args,
            input=input_text,
            env=self.environment,
            cwd=self.root,  # where `sbatch --wrap` jobs leave their slurm-<id>.out
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert result.returncode == 0 or not check, f"{' '.join(args)}: {result.stderr}"
        return result.stdout

    def start(self) -> SlurmCluster:
        self._write_files()
        self._spawn(
            "munged",
            "munged",
            "--foreground",
            f"--socket={self.munge_socket}",
            f"--key-file={self.root / 'munge' / 'munge.key'}",
            f"--pid-file={self.root / 'munge' / 'munged.pid'}",
            f"--seed-file={self.root / 'munge' / 'munged.seed'}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
        )
        self._wait_for(lambda: self.munge_socket.exists(), "munged socket", 10)
        self._spawn("slurmctld", "slurmctld", "-D", "-c")
        for node in self.node_names:
            self._spawn(f"slurmd-{node}", "slurmd", "-D", "-N", node)
        self._wait_for(self._nodes_ready, "both nodes IDLE with their GPUs", 40)
        return self

    def stop(self) -> None:
        """Cancel every job, then stop slurmd, slurmctld and munged by their handles."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            subprocess.run(
                ["scancel", "--full", "--signal=KILL", "--state=RUNNING", "--me"],
                env=self.environment, capture_output=True, timeout=30, check=False,
            )  # fmt: skip
            subprocess.run(
                ["scancel", "--me"], env=self.environment, capture_output=True, timeout=30,
                check=False,
            )  # fmt: skip
            self._wait_for(self._no_active_jobs, "all jobs ended", 20, raise_error=False)
        order = [n for n in self._procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            proc = self._procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)

    def listeners(self) -> dict[str, set[str]]:
        """Program -> the addresses (ip:port) its TCP sockets listen on, for this cluster's
        daemons and the `srun`s of its jobs (found by their SLURM_CONF: other clusters on this
        machine are not ours to judge)."""
        pids = {proc.pid for proc in self._procs.values() if proc.poll() is None}
        for process in psutil.process_iter(["name"]):
            if process.info["name"] == "srun":
                with contextlib.suppress(psutil.Error):
                    if process.environ().get("SLURM_CONF") == str(self.conf):
                        pids.add(process.pid)
        found: dict[str, set[str]] = {}
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                process = psutil.Process(pid)
                for conn in process.net_connections(kind="inet"):
                    if conn.status == psutil.CONN_LISTEN:
                        address = f"{conn.laddr.ip}:{conn.laddr.port}"
                        found.setdefault(process.name(), set()).add(address)
        return found

    def logs(self) -> str:
        """The tail of every daemon's log (for a failure message)."""
        parts = []
        for path in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {path.name}\n" + "\n".join(path.read_text().splitlines()[-15:]))
        return "\n".join(parts)

    # -- set-up ------------------------------------------------------------------------------

    def _write_files(self) -> None:
        for sub in ("etc", "munge", "run", "state", "spool", "log", "dev"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # munged wants its key private and its socket's directory searchable by everyone.
        self.root.chmod(0o755)
        (self.root / "run").chmod(0o755)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        ctld_port, default_port = free_port(), free_port()
        node_lines, gres_lines = [], ["AutoDetect=off"]
        for node in self.node_names:
            devices = self.root / "dev" / node
            devices.mkdir(exist_ok=True)
            for index in range(GPUS_PER_NODE):
                (devices / f"nvidia{index}").touch()
            (self.root / "spool" / node).mkdir(exist_ok=True)
            features = "ib,nvlink" if node == self.node_names[0] else "ib"
            node_lines.append(
                f"NodeName={node} NodeHostname={self.host} NodeAddr=127.0.0.1 Port={free_port()} "
                f"CPUs=8 RealMemory=1000 Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE} Feature={features} "
                "State=UNKNOWN"
            )
            gres_lines.append(
                f"NodeName={node} Name=gpu Type={GPU_TYPE} "
                f"File={devices}/nvidia[0-{GPUS_PER_NODE - 1}]"
            )
        r = self.root
        settings = {
            "ClusterName": "gpufedtest",
            "SlurmctldHost": f"{self.host}(127.0.0.1)",
            "SlurmctldPort": ctld_port,
            # Bind to the addresses above, not to every interface (the default).
            "CommunicationParameters": "NoCtldInAddrAny,NoInAddrAny",
            "SlurmdPort": default_port,
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "CredType": "cred/munge",
            "AuthInfo": f"socket={self.munge_socket}",
            "StateSaveLocation": r / "state",
            "SlurmdSpoolDir": r / "spool" / "%n",
            "SlurmctldPidFile": r / "run" / "slurmctld.pid",
            "SlurmdPidFile": r / "run" / "slurmd-%n.pid",
            "SlurmctldLogFile": r / "log" / "slurmctld.log",
            "SlurmdLogFile": r / "log" / "slurmd-%n.log",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SchedulerType": "sched/backfill",
            "MpiDefault": "none",
            "JobAcctGatherType": "jobacct_gather/none",
            "AccountingStorageType": "accounting_storage/none",
            "ReturnToService": 2,
            # Eight CPUs per node whatever this machine has.
            "SlurmdParameters": "config_overrides",
            "KillWait": 2,
            "MinJobAge": 300,
            "MailProg": "/bin/true",
            "GresTypes": "gpu",
        }
        lines = [f"{key}={value}" for key, value in settings.items()]
        lines += node_lines
        lines.append(
            f"PartitionName=gpu Nodes={','.join(self.node_names)} Default=YES MaxTime=INFINITE "
            "State=UP"
        )
        self.conf.write_text("\n".join(lines) + "\n")
        (self.root / "etc" / "gres.conf").write_text("\n".join(gres_lines) + "\n")

    def _spawn(self, name: str, *args: str) -> None:
        program = shutil.which(args[0], path=_SEARCH_PATH)
        assert program is not None, args[0]
        out = open(self.root / "log" / f"{name}.out", "wb")  # noqa: SIM115
        try:
            self._procs[name] = subprocess.Popen(
                [program, *args[1:]],
                env=self.environment,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        finally:
            out.close()

    def _nodes_ready(self) -> bool:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.logs()}")
        result = subprocess.run(
            ["scontrol", "-o", "show", "node"],
            env=self.environment, capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        lines = [line for line in result.stdout.splitlines() if line.startswith("NodeName=")]
        return len(lines) == len(self.node_names) and all(
            " State=IDLE " in line and f"Gres=gpu:{GPU_TYPE}:{GPUS_PER_NODE}" in line
            for line in lines
        )

    def _no_active_jobs(self) -> bool:
        result = subprocess.run(
            ["squeue", "--noheader", "-o", "%i"],
            env=self.environment, capture_output=True, text=True, timeout=10, check=False,
        )  # fmt: skip
        return result.returncode == 0 and not result.stdout.strip()

    def _wait_for(
        self, condition: Callable[[], bool], what: str, limit_s: float, raise_error: bool = True
    ) -> None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        if raise_error:
            raise RuntimeError(f"Slurm test cluster: no {what} within {limit_s:g} s\n{self.logs()}")
