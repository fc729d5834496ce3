"""The snapshot placement sees: assumed allocations off, reported ends back on."""

from __future__ import annotations

from hub.core.fleet import build_snapshot
from hub.core.model import RunningWorkload
from schemas import Assignment, CapacityReport, NodeCapacity, RunningRef, WorkloadSpec

SPEC = WorkloadSpec(name="w", team="t", command=("true",))


def report(
    free: tuple[int, ...], running: tuple[tuple[str, int], ...] = (), **shared: float
) -> CapacityReport:
    return CapacityReport(
        spoke_id="s1",
        region="eu",
        incarnation="i",
        seq=1,
        sent_at=0,
        nodes=(
            NodeCapacity(
                name="n0",
                gpu_model="H100",
                gpu_count=4,
                free_devices=free,
                device_free_fraction={int(k[1:]): v for k, v in shared.items()},
            ),
        ),
        running=tuple(RunningRef(workload_id=w, epoch=e) for w, e in running),
    )


def workload(wid: str, devices: tuple[int, ...], fraction: float | None = None) -> RunningWorkload:
    return RunningWorkload(
        id=wid,
        spec=SPEC,
        spoke_id="s1",
        assignments=(Assignment(node="n0", devices=devices, fraction=fraction),),
        started_at=0,
    )


def free_of(snapshot: object) -> tuple[tuple[int, ...], dict[int, float]]:
    node = snapshot.spokes[0].nodes[0]  # type: ignore[attr-defined]
    return node.free, dict(node.free_fraction)


def test_a_placement_the_report_does_not_show_yet_is_assumed() -> None:
    snap = build_snapshot({"s1": report((0, 1, 2, 3))}, [(workload("a", (1, 2)), 1, None)], {})
    assert free_of(snap) == ((0, 3), {})


def test_a_placement_the_report_shows_is_not_taken_twice() -> None:
    rep = report((0, 3), running=(("a", 1),))
    snap = build_snapshot({"s1": rep}, [(workload("a", (1, 2)), 1, None)], {})
    assert free_of(snap) == ((0, 3), {})


def test_an_ended_workload_still_in_the_report_frees_its_devices() -> None:
    rep = report((0, 3), running=(("a", 1),))
    snap = build_snapshot({"s1": rep}, [], {}, ended=[(workload("a", (1, 2)), 1)])
    assert free_of(snap) == ((0, 1, 2, 3), {})


def test_an_ended_workload_of_another_epoch_frees_nothing() -> None:
    rep = report((0, 3), running=(("a", 2),))
    snap = build_snapshot({"s1": rep}, [], {}, ended=[(workload("a", (1, 2)), 1)])
    assert free_of(snap) == ((0, 3), {})


def test_fractions_are_assumed_and_given_back() -> None:
    assumed = build_snapshot(
        {"s1": report((0, 1, 2, 3))}, [(workload("f", (2,), 0.25), 1, None)], {}
    )
    assert free_of(assumed) == ((0, 1, 3), {2: 0.75})
    rep = report((0, 1, 3), running=(("f", 1),), d2=0.75)
    back = build_snapshot({"s1": rep}, [], {}, ended=[(workload("f", (2,), 0.25), 1)])
    assert free_of(back) == ((0, 1, 2, 3), {})


def test_an_applied_placement_missing_from_the_report_is_not_assumed() -> None:
    # The spoke applied command 7 and runs nothing: the workload already ended there.
    rep = report((0, 1, 2, 3)).model_copy(update={"applied_seq": 7})
    snap = build_snapshot({"s1": rep}, [(workload("a", (1, 2)), 1, 7)], {})
    assert free_of(snap) == ((0, 1, 2, 3), {})
    not_yet = build_snapshot({"s1": rep}, [(workload("b", (1, 2)), 1, 8)], {})
    assert free_of(not_yet) == ((0, 3), {})


def test_suspect_spokes_are_marked() -> None:
    snap = build_snapshot({"s1": report((0,))}, [], {"s1": False})
    assert snap.spokes[0].accepts_work is False
