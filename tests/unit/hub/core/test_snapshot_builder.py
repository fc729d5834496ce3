"""The hub's snapshot kept between cycles (hub.core.fleet.SnapshotBuilder) is build_snapshot's,
with the nodes and spokes nothing changed on handed back as the same objects."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.fleet import SnapshotBuilder, build_snapshot
from hub.core.model import RunningWorkload
from schemas import Assignment, CapacityReport, NodeCapacity, RunningRef, WorkloadSpec

SPEC = WorkloadSpec(name="w", team="t", command=("true",))
SPOKES = ("s1", "s2")
NODES = ("n0", "n1", "n2")


def report(
    spoke: str,
    free: dict[str, tuple[int, ...]],
    running: tuple[tuple[str, int], ...],
    applied: int = 0,
    labels: dict[str, str] | None = None,
    order: tuple[str, ...] = NODES,
) -> CapacityReport:
    return CapacityReport(
        spoke_id=spoke,
        region="eu",
        incarnation="i",
        seq=1,
        sent_at=0,
        applied_seq=applied,
        labels=labels or {},
        nodes=tuple(
            NodeCapacity(name=n, gpu_model="H100", gpu_count=4, free_devices=free[n]) for n in NODES
        ),
        running=tuple(RunningRef(workload_id=w, epoch=e) for w, e in running),
    )


def workload(wid: str, spoke: str, node: str, devices: tuple[int, ...]) -> RunningWorkload:
    return RunningWorkload(
        id=wid,
        spec=SPEC,
        spoke_id=spoke,
        assignments=(Assignment(node=node, devices=devices),),
        started_at=0,
    )


@st.composite
def worlds(draw: st.DrawFn) -> tuple[dict[str, CapacityReport], list, list, dict[str, bool]]:  # type: ignore[type-arg]
    reports = {}
    active = []
    ended = []
    for spoke in draw(st.sets(st.sampled_from(SPOKES), min_size=1)):
        free = {n: tuple(sorted(draw(st.sets(st.integers(0, 3))))) for n in NODES}
        listed = draw(st.lists(st.sampled_from(("a", "b", "c")), unique=True))
        labels = draw(st.sampled_from(({}, {"burst-team": "t"})))
        order = tuple(draw(st.permutations(NODES)))  # a spoke that lists its nodes anew
        reports[spoke] = report(
            spoke, free, tuple((f"{spoke}-{w}", 1) for w in listed), 5, labels, order
        )
        for wid in ("a", "b", "c", "d"):
            node = draw(st.sampled_from(NODES))
            devices = (draw(st.integers(0, 3)),)
            w = workload(f"{spoke}-{wid}", spoke, node, devices)
            where = draw(st.sampled_from(("active", "ended", "none")))
            if where == "active":
                active.append(
                    (w, draw(st.sampled_from((1, 2))), draw(st.sampled_from((None, 3, 7))))
                )
            elif where == "ended":
                ended.append((w, 1))
    accepting = {s: draw(st.booleans()) for s in reports}
    return reports, active, ended, accepting


@settings(max_examples=150, deadline=None)
@given(st.lists(worlds(), min_size=1, max_size=6), st.data())
def test_kept_snapshots_equal_fresh_ones(steps: list, data: st.DataObject) -> None:  # type: ignore[type-arg]
    builder = SnapshotBuilder()
    last: dict[str, CapacityReport] = {}
    for reports, active, ended, accepting in steps:
        # Some spokes send nothing new: their last report stays the same object.
        reports = {
            s: last[s] if s in last and data.draw(st.booleans()) else r for s, r in reports.items()
        }
        last = reports
        assert builder.build(reports, active, accepting, ended) == build_snapshot(
            reports, active, accepting, ended
        )


def test_nodes_and_spokes_nothing_changed_on_are_the_same_objects() -> None:
    free = {"n0": (0, 1, 2, 3), "n1": (0, 1), "n2": ()}
    builder = SnapshotBuilder()
    placed = workload("w", "s1", "n0", (0, 1))
    first = builder.build({"s1": report("s1", free, ()), "s2": report("s2", free, ())}, [], {})
    # A new report of s2 with the same content, and a placement on s1's n0 not reported yet.
    second = builder.build(
        {"s1": report("s1", free, ()), "s2": report("s2", free, ())}, [(placed, 1, None)], {}
    )
    assert second.spokes[1] is first.spokes[1]
    assert second.spokes[0] is not first.spokes[0]
    assert second.spokes[0].nodes[0].free == (2, 3)
    assert second.spokes[0].nodes[1] is first.spokes[0].nodes[1]
    assert second.spokes[0].nodes[2] is first.spokes[0].nodes[2]
