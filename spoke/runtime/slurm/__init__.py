"""Workloads as Slurm batch jobs, one per (workload, epoch), for spokes on a Slurm login node.

A placed workload becomes one `sbatch` job pinned to the assigned nodes (`--nodelist`,
`--gres=gpu:N` per node); a gang of N nodes is one N-node job whose script starts the command on
every node with `srun`, so Slurm starts all nodes together. The job's name and comment carry the
workload id and epoch ("gpufed:<spoke>:<workload>:<epoch>"): a restarted spoke finds its jobs by
them. Status comes from `squeue` and `scontrol show job` (accounting through slurmdbd is not
needed); cancel and preempt use `scancel` (SIGTERM to the tasks, SIGKILL after the grace).

Modules: `runtime` (SlurmRuntime), `jobs` (the sbatch options, script and environment of a
launch), `status` (what a job state means), `record` (submitted jobs and reported ends),
`lease` (a fenced job stops itself once the spoke's lease runs out, spoke or no spoke). The
Slurm commands and the parsers of their output, shared with the inventory, are `spoke.slurm`.
"""

from spoke.runtime.slurm.jobs import SiteOptions, build_batch_job, job_name_for
from spoke.runtime.slurm.runtime import SlurmRuntime

__all__ = ["SiteOptions", "SlurmRuntime", "build_batch_job", "job_name_for"]
