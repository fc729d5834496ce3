"""GPU inventory of a Slurm cluster, from `scontrol -d -o show node` and this user's queue.

One NodeInventory per node with GPUs (`Gres=gpu[:type]:N`), limited to one partition when the
spoke serves one. Its GPU model is the GRES type made short ("h100", "nvidia_h100_80gb_hbm3" ->
"H100"; untyped GPUs are "GPU"). A node with several GPU types is one pool per type, named
"<node>/<type>"; the Slurm runtime turns that back into the node and a typed `--gres`.

Only IDLE, MIXED, ALLOCATED and COMPLETING nodes without a DRAIN, FAIL, MAINT, NOT_RESPONDING,
RESERVED, reboot or power flag are schedulable. Labels: `slurm/state` (the node state, lower
case), `slurm.partition/<name>` and `slurm.feature/<name>` ("true"). GPUs in use by jobs this
spoke did not submit (other users', other spokes') are `busy_outside`: Slurm's GresUsed minus
what this spoke's own jobs hold.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from spoke.inventory.models import short_model
from spoke.ports import NodeInventory
from spoke.slurm.commands import SlurmCli
from spoke.slurm.parse import (
    ACTIVE_STATES,
    POOL_SEPARATOR,
    QueuedJob,
    SlurmNode,
    job_identity,
    parse_nodes,
)

SCHEDULABLE_STATES = frozenset({"IDLE", "MIXED", "ALLOCATED", "COMPLETING"})
UNSCHEDULABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "MAINT",
        "NOT_RESPONDING",
        "RESERVED",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "POWER_DOWN",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "INVALID_REG",
    }
)
#: Job states that hold GPUs on their nodes (pending and requeued ones hold none).
_HOLDING_STATES = ACTIVE_STATES - {
    "PENDING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "RESV_DEL_HOLD",
}
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


class SlurmInventory:
    """Inventory from the Slurm controller; `partition` limits it to that partition's nodes."""

    def __init__(self, cli: SlurmCli, spoke_id: str, partition: str | None = None) -> None:
        self._cli = cli
        self._spoke_id = spoke_id
        self._partition = partition

    async def nodes(self) -> list[NodeInventory]:
        """Current GPU nodes. Raises SpokeError when the controller cannot be asked."""
        nodes = parse_nodes(await self._cli.nodes())
        queue = await self._cli.queue()
        return node_inventories(nodes, queue, self._spoke_id, self._partition)


def node_inventories(
    nodes: Iterable[SlurmNode],
    queue: Iterable[QueuedJob],
    spoke_id: str,
    partition: str | None = None,
) -> list[NodeInventory]:
    """The GPU pools of `nodes`; `queue` is this user's jobs (those of `spoke_id` are ours)."""
    ours = _held_by_spoke(queue, spoke_id)
    result: list[NodeInventory] = []
    for node in nodes:
        if partition is not None and partition not in node.partitions:
            continue
        gpus = {gpu_type: count for gpu_type, count in node.gres.items() if count > 0}
        if not gpus:
            continue
        labels = _labels(node)
        schedulable = schedulable_state(node.state)
        for gpu_type, count in sorted(gpus.items()):
            if len(gpus) == 1:
                name, held = node.name, sum(ours[node.name].values())
            else:
                name, held = f"{node.name}{POOL_SEPARATOR}{gpu_type}", ours[node.name][gpu_type]
            used = node.gres_used.get(gpu_type, 0)
            result.append(
                NodeInventory(
                    name=name,
                    gpu_model=gpu_model(gpu_type),
                    gpu_count=count,
                    labels=labels,
                    schedulable=schedulable,
                    busy_outside=min(count, max(0, used - held)),
                )
            )
    return result


def gpu_model(gpu_type: str) -> str:
    """The model users ask for, from a GRES type: "nvidia_h100_80gb_hbm3" -> "H100"."""
    if not gpu_type:
        return "GPU"
    return short_model(gpu_type.replace("_", " ")).upper()


def schedulable_state(state: str) -> bool:
    """May new work go to a node in this state ("MIXED", "IDLE+DRAIN", "DOWN+NOT_RESPONDING")?"""
    base, *flags = state.split("+")
    return base.rstrip("*~#!%$@^-") in SCHEDULABLE_STATES and not (set(flags) & UNSCHEDULABLE_FLAGS)


def _held_by_spoke(queue: Iterable[QueuedJob], spoke_id: str) -> dict[str, dict[str, int]]:
    held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for job in queue:
        identity = job_identity(job.comment)
        if identity is None or identity.spoke_id != spoke_id or job.state not in _HOLDING_STATES:
            continue
        for node in job.nodes:
            for gpu_type, count in job.gpus_per_node.items():
                held[node][gpu_type] += count
    return held


def _labels(node: SlurmNode) -> dict[str, str]:
    labels = {"slurm/state": node.state.lower()}
    for prefix, names in (("slurm.partition", node.partitions), ("slurm.feature", node.features)):
        for name in names:
            if _LABEL_NAME.match(name):
                labels[f"{prefix}/{name}"] = "true"
    return labels
