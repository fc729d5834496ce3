"""A queued workload that a cloud instance is being rented for, said where its wait is shown.

The burst controller names, in each instance's events, the workloads it rents it for
(`InstanceEvent.workload_ids`). While such an instance is still `requested` (asked of the
cloud, its spoke not yet joined), those workloads wait for it, not for on-prem devices: the
API's `cloud_instance`, `gpufed jobs` and `gpufed explain` say so.
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas.burst import InstanceEvent, InstanceState


def starting_for(
    instances: Mapping[str, InstanceEvent], workload_id: str, now: float
) -> str | None:
    """'burst-3 (g5.12xlarge, 4 A10G), asked for 40 s ago' for the requested instance rented
    for `workload_id`, the latest asked for if several; None when there is none."""
    found = [
        i
        for i in instances.values()
        if i.state is InstanceState.REQUESTED and workload_id in i.workload_ids
    ]
    if not found:
        return None
    latest = max(found, key=lambda i: i.at)
    gpus = f", {latest.gpu_count} {latest.gpu_model}" if latest.gpu_count else ""
    ago = max(0.0, now - latest.at)
    return f"{latest.burst_id} ({latest.instance_type}{gpus}), asked for {ago:.0f} s ago"
