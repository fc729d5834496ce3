"""A refused spec's field named as the command a user typed spells it: the hub answers
`gpus_per_node: Input should be greater than or equal to 1`, and `gpufed submit` adds
`(--gpus)`, as the user never typed `gpus_per_node`. Every field a flag sets is named, the
ones spelled alike too (`name: Field required (--name)`), from the field the hub's answer
names (`priority class 'urgent' is not defined ... (--priority)`) or else its message's."""

from __future__ import annotations

from collections.abc import Mapping

from gpufed.client import ApiError

_COMMAND = "the program and its arguments after --"

#: The spec's fields as `gpufed submit` spells them.
SUBMIT_FLAGS = {
    "name": "--name",
    "team": "--team",
    "kind": "--kind",
    "nodes": "--nodes",
    "env": "--env",
    "gpus_per_node": "--gpus",
    "gpu_fraction": "--fraction",
    "gpu_models": "--gpu-model",
    "priority_class": "--priority",
    "max_runtime_s": "--max-runtime",
    "affinity.required_regions": "--region",
    "command": _COMMAND,
}

#: The fields `gpufed session open` sets (its --gpus is a share of one GPU or whole GPUs).
SESSION_FLAGS = {
    "name": "--name",
    "team": "--team",
    "gpus_per_node": "--gpus",
    "gpu_fraction": "--gpus",
    "gpu_models": "--gpu-model",
    "priority_class": "--priority",
    "affinity.required_regions": "--region",
}

#: A service spec's fields as `gpufed service create|update` spells them.
SERVICE_FLAGS = {
    "name": "--name",
    "team": "--team",
    "replica": f"the replica's command: {_COMMAND}",
    "replica.command": _COMMAND,
    "replica.gpus": "--gpus",
    "replica.gpu_fraction": "--fraction",
    "min_replicas": "--min",
    "max_replicas": "--max",
    "priority_class": "--priority",
    "autoscaling.target": "--target-rps",
    "health.path": "--health-path",
    "regions": "--region",
}


def naming_the_flag(exc: ApiError, flags: Mapping[str, str]) -> ApiError:
    """`exc` with the flag of the spec field it names, when it names one of `flags`."""
    flag = flags.get(exc.field or "") or flags.get(str(exc).split(":", 1)[0])
    if exc.code != "invalid_workload" or flag is None:
        return exc
    return ApiError(f"{exc} ({flag})", code=exc.code, status=exc.status, field=exc.field)
