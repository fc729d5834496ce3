"""A queued workload that a cloud instance is being rented for, said where its wait is shown.

The burst controller names, in each instance's events, the workloads it rents it for
(`InstanceEvent.workload_ids`). While such an instance is still `requested` (asked of the
cloud, its spoke not yet joined), those workloads wait for it, not for on-prem devices: the
API's `cloud_instance`, `gpufed jobs` and `gpufed explain` say so.

When the controller rents nothing for a waiting workload, it says why (`BurstVerdicts`: a
spent budget, no instance type that fits, a team that may not burst, not waited long enough
yet): the API's `cloud_refused` and the same commands show its latest word.
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas.burst import BurstVerdicts, InstanceEvent, InstanceState


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


#: A controller's verdicts are forgotten this long after its last report: it sends them every
#: 10 s while there are any (`burst.verdicts.VERDICTS_EVERY_S`), so silence means it stopped.
VERDICTS_FRESH_S = 30.0


class Verdicts:
    """Each burst controller's latest verdicts, indexed by the workloads they name."""

    def __init__(self) -> None:
        self._latest: dict[str, BurstVerdicts] = {}
        self._by_workload: dict[str, tuple[str, float]] = {}

    def update(self, report: BurstVerdicts) -> None:
        """`report` replaces its controller's last (several providers may run at once)."""
        self._latest[report.provider] = report
        index: dict[str, tuple[str, float]] = {}
        for latest in sorted(self._latest.values(), key=lambda r: r.at):
            for verdict in latest.verdicts:
                said = f"{verdict.message} [{verdict.reason}]"
                for workload_id in verdict.workload_ids:
                    index[workload_id] = (said, latest.at)
        self._by_workload = index

    def refused_for(self, workload_id: str, now: float) -> str | None:
        """Why burst rents nothing for `workload_id` ('no catalog instance type fits ...
        [no_offer]'), from a report of the last VERDICTS_FRESH_S; None when it said nothing."""
        found = self._by_workload.get(workload_id)
        if found is None or now - found[1] > VERDICTS_FRESH_S:
            return None
        return found[0]
