"""Whether a capacity report may claim what it claims: labels only burst may give a spoke.

Pure: the hub's capacity handler calls `forged_burst_labels` with the report and what it knows
of the burst instance of that id (None when burst never launched one), and drops a report that
claims a label it may not (counted and logged as malformed).
"""

from __future__ import annotations

from hub.core.fleet import BURST_TEAM_LABEL
from schemas.burst import InstanceEvent
from schemas.capacity import CapacityReport

#: Labels that only a spoke launched by burst may carry: `burst-team` reserves the spoke for a
#: team (its work goes there first), so a spoke that gives it to itself would draw that team's
#: work.
BURST_ONLY_LABELS = frozenset({BURST_TEAM_LABEL})


def forged_burst_labels(report: CapacityReport, instance: InstanceEvent | None) -> tuple[str, ...]:
    """The burst-only labels `report` claims without the right to, sorted; empty when none.

    `instance` is the latest event of the burst instance whose id is the report's spoke id. A
    spoke burst never launched may carry none of BURST_ONLY_LABELS; a burst spoke only
    `burst-team` naming the team it was rented for.
    """
    claimed = sorted(BURST_ONLY_LABELS & report.labels.keys())
    if not claimed:
        return ()
    if instance is None or instance.spoke_id not in (None, report.spoke_id):
        return tuple(claimed)
    forged = []
    if report.labels.get(BURST_TEAM_LABEL, instance.team) != instance.team:
        forged.append(BURST_TEAM_LABEL)
    return tuple(forged)
