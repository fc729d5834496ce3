"""What the Slurm inventory and runtime share: the Slurm CLIs (`commands`) and pure parsers of
their output (`parse`), as `spoke.kube` is for Kubernetes."""

from spoke.slurm.commands import SlurmCli, base_environment

__all__ = ["SlurmCli", "base_environment"]
