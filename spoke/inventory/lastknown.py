"""The inventory as last read, while the cluster cannot be asked.

A Slurm controller restarting, a Kubernetes API server away for a few minutes, NVML failing for
a moment: the spoke and its work are still there (slurmd and the kubelet run the work on), so
its heartbeat must go on. Without one the hub declares the spoke lost after `lost_after` and runs
its work a second time elsewhere, and the spoke, unacknowledged, fences it. While readings fail
the spoke reports the nodes it last read, none of them schedulable: the hub places nothing new
there and leaves what runs alone. Until a first reading there is nothing to report, and the
failure is raised (at start `gpufed spoke` exits saying why).
"""

from __future__ import annotations

import dataclasses

import structlog

from spoke.ports import Inventory, NodeInventory

log = structlog.get_logger(__name__)


class LastKnown:
    """An `Inventory` that answers with the last reading, unschedulable, while reading fails."""

    def __init__(self, inventory: Inventory) -> None:
        self._inventory = inventory
        self._last: list[NodeInventory] | None = None
        self.failing = False  # the last reading failed: the nodes reported are the ones before

    async def nodes(self) -> list[NodeInventory]:
        """Fresh nodes; after a first reading, never raises. Logged once per failure."""
        try:
            nodes = await self._inventory.nodes()
        except Exception as exc:
            if self._last is None:
                raise
            if not self.failing:
                log.warning(
                    "inventory_unreadable",
                    error=str(exc) or type(exc).__name__,
                    nodes=len(self._last),
                    reported="unschedulable until it answers again",
                )
            self.failing = True
            return [dataclasses.replace(n, schedulable=False) for n in self._last]
        if self.failing:
            log.info("inventory_readable_again", nodes=len(nodes))
            self.failing = False
        self._last = nodes
        return nodes
