"""The batch job a launch becomes: sbatch options, the batch script and the job's environment.

Pure functions of a Launch: no commands run here. One job per (workload, epoch), pinned to the
assigned nodes; a gang of N nodes is one N-node job whose script starts the command on every
node with one `srun` (Slurm starts all nodes together and `--kill-on-bad-exit` ends them
together). The batch shell writes the command's exit status to a file, so an end is known even
after the controller has forgotten the job.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spoke.errors import PermanentSpokeError
from spoke.ports import Launch
from spoke.runtime.slurm.lease import JobLease
from spoke.slurm.parse import POOL_SEPARATOR, job_comment

#: Variables a workload may not set: sbatch and srun read them as options (a partition, an
#: account, a node list), which would let a workload step outside its assignment.
RESERVED_ENV_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
#: Runs on every node: the node's rank and name, then the command itself (a missing program
#: exits 127 like in a shell, so it is reported as command_not_found).
_TASK = 'export GPUFED_NODE_RANK="$SLURM_NODEID" GPUFED_NODE="$SLURMD_NODENAME"; exec "$@"'
#: A gang's tasks also learn where rank 0 listens for the others: the node srun ran on (the
#: batch script runs on the allocation's first node, rank 0's), on a port of the job's own
#: below Linux's ephemeral range (two jobs sharing a node do not pick the same one).
_GANG_TASK = _TASK.replace(
    "; exec",
    ' GPUFED_MASTER_ADDR="$SLURM_LAUNCH_NODE_IPADDR"'
    " GPUFED_MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000)); exec",
)


@dataclass(frozen=True, slots=True)
class BatchJob:
    """What `sbatch` is given for one launch."""

    name: str
    comment: str
    options: tuple[str, ...]
    script: str
    environment: dict[str, str]


@dataclass(frozen=True, slots=True)
class SiteOptions:
    """Where this spoke's jobs go in the cluster: partition, account and QOS (None: defaults)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None


def job_name_for(workload_id: str, epoch: int) -> str:
    """The job's name, for people reading squeue ("gpufed-train-7-e2")."""
    return f"gpufed-{workload_id}-e{epoch}"


def build_batch_job(
    launch: Launch,
    *,
    spoke_id: str,
    log_path: Path,
    exit_path: Path,
    workdir: Path,
    site: SiteOptions,
    base_environment: Mapping[str, str],
    lease: JobLease | None = None,
) -> BatchJob:
    """The batch job for one launch (`lease`: a fenced one's, see lease.py). Raises
    PermanentSpokeError for what it cannot express."""
    spec = launch.spec
    hosts, gres = placement(launch)
    name = job_name_for(launch.workload_id, launch.epoch)
    comment = job_comment(spoke_id, launch.workload_id, launch.epoch)
    options = [
        f"--job-name={name}",
        f"--comment={comment}",
        f"--nodes={len(hosts)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(hosts)}",
        f"--gres={gres}",
        f"--output={log_path}",
        "--open-mode=append",
        f"--chdir={spec.working_dir or workdir}",
        "--export=ALL",
        # A node failure ends the job (NODE_FAIL) instead of requeueing it behind the hub's back.
        "--no-requeue",
    ]
    if spec.max_runtime_s is not None:
        minutes, seconds = divmod(spec.max_runtime_s, 60)
        options.append(f"--time={minutes}:{seconds:02d}")
    if site.partition:
        options.append(f"--partition={site.partition}")
    if site.account:
        options.append(f"--account={site.account}")
    if site.qos:
        options.append(f"--qos={site.qos}")
    return BatchJob(
        name=name,
        comment=comment,
        options=tuple(options),
        script=batch_script(launch, exit_path, lease),
        environment=job_environment(launch, base_environment),
    )


def placement(launch: Launch) -> tuple[list[str], str]:
    """The node names and the `--gres` value (GPUs per node) the launch asks for."""
    spec = launch.spec
    if spec.kind.exposes_port:
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: the Slurm runtime does not run a {spec.kind.value} "
            "(it exposes no port of a batch job); place it on a local or Kubernetes spoke"
        )
    if spec.gpu_fraction is not None:
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: fractional GPUs are not supported by the Slurm "
            "runtime (Slurm shares a GPU through MPS or shard GRES, which gpufed does not "
            "drive); ask for whole GPUs or place it on a local-runtime spoke"
        )
    hosts: list[str] = []
    kinds: set[tuple[str, int]] = set()
    for assignment in launch.assignments:
        host, _, gpu_type = assignment.node.partition(POOL_SEPARATOR)
        hosts.append(host)
        kinds.add((gpu_type, len(assignment.devices)))
    if len(hosts) != spec.nodes or len(set(hosts)) != len(hosts):
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: needs {spec.nodes} distinct node(s), "
            f"was assigned {hosts}"
        )
    if len(kinds) != 1:
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: assignments differ in GPU type or count "
            f"{sorted(kinds)}; one Slurm job asks the same GPUs of every node"
        )
    gpu_type, count = kinds.pop()
    if count < 1:
        raise PermanentSpokeError(f"workload {launch.workload_id}: assigned no GPUs")
    return hosts, f"gpu:{gpu_type}:{count}" if gpu_type else f"gpu:{count}"


def batch_script(launch: Launch, exit_path: Path, lease: JobLease | None = None) -> str:
    """The batch script: one srun task per node, then the exit status into `exit_path`. With a
    `lease`, the srun runs beside a watcher that stops it once the lease runs out."""
    nodes = launch.spec.nodes
    srun = [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "/bin/sh",
        "-c",
        _GANG_TASK if nodes > 1 else _TASK,
        "gpufed-task",
        *launch.spec.command,
    ]
    run = [shlex.join(srun), "code=$?"] if lease is None else [shlex.join(srun) + " &"]
    return "\n".join(
        [
            "#!/bin/sh",
            f"# gpufed workload {launch.workload_id}, epoch {launch.epoch}",
            *run,
            *(lease.watcher() if lease is not None else ()),
            f'echo "$code" > {shlex.quote(str(exit_path))}',
            'exit "$code"',
            "",
        ]
    )


def job_environment(launch: Launch, base: Mapping[str, str]) -> dict[str, str]:
    """The job's variables: the spoke's passed ones, the workload's own, then gpufed's."""
    reserved = sorted(k for k in launch.spec.env if k.startswith(RESERVED_ENV_PREFIXES))
    if reserved:
        raise PermanentSpokeError(
            f"workload {launch.workload_id}: environment variables {reserved} are reserved on "
            "Slurm (sbatch and srun read them as options)"
        )
    env = dict(base)
    env.update(launch.spec.env)
    env.update(
        {
            "GPUFED_WORKLOAD_ID": launch.workload_id,
            "GPUFED_EPOCH": str(launch.epoch),
            "GPUFED_NUM_NODES": str(launch.spec.nodes),
        }
    )
    return env
