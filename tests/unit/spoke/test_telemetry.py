"""GPU utilisation on spokes: simulated loads, and the allocated-but-idle rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas import Assignment
from spoke.ports import NodeInventory
from spoke.telemetry import (
    IDLE_AFTER_S,
    DeviceSample,
    SimulatedTelemetry,
    allocated_idle,
    idle_since,
)

NODE = NodeInventory("n0", "H100", 4, labels={"nvidia.com/gpu.memory-mib": "81559"})


def sample(index: int, util: float) -> DeviceSample:
    return DeviceSample("n0", index, "H100", util, 0.0)


def test_an_allocated_gpu_is_idle_only_after_ten_unbroken_minutes_under_five_percent() -> None:
    allocated = {("n0", 0), ("n0", 1)}
    state: dict[tuple[str, int], float] = {}
    t = 0.0
    for minute in range(12):
        t = minute * 60.0
        # device 0: 2 % throughout; device 1: idle but busy once at minute 6; 2: not allocated
        busy1 = 50.0 if minute == 6 else 1.0
        state = idle_since(state, [sample(0, 2.0), sample(1, busy1), sample(2, 0.0)], allocated, t)
        if minute == 9:
            assert allocated_idle(state, t) == set()
    assert t == 660.0
    assert allocated_idle(state, t) == {("n0", 0)}
    assert allocated_idle(state, 7 * 60.0 + IDLE_AFTER_S) == {("n0", 0), ("n0", 1)}


def test_a_gpu_at_exactly_five_percent_is_not_idle() -> None:
    state = idle_since({}, [sample(0, 5.0)], {("n0", 0)}, 0.0)
    assert allocated_idle(state, IDLE_AFTER_S) == set()


def test_a_released_gpu_stops_counting() -> None:
    state = idle_since({}, [sample(0, 0.0)], {("n0", 0)}, 0.0)
    state = idle_since(state, [sample(0, 0.0)], set(), 700.0)
    assert allocated_idle(state, 700.0) == set()


async def test_simulated_gpus_report_what_their_workloads_write(tmp_path: Path) -> None:
    telemetry = SimulatedTelemetry(tmp_path)
    allocations = {
        "quiet": (1, (Assignment(node="n0", devices=(0,)),)),
        "silent": (1, (Assignment(node="n0", devices=(1,)),)),
        "half-a": (1, (Assignment(node="n0", devices=(2,), fraction=0.5),)),
        "half-b": (1, (Assignment(node="n0", devices=(2,), fraction=0.5),)),
    }
    tmp_path.joinpath("quiet.load").write_text("3 1024\n")
    tmp_path.joinpath("half-a.load").write_text("80")
    tmp_path.joinpath("half-b.load").write_text("not a number")
    samples = {s.index: s for s in await telemetry.sample([NODE], allocations)}
    assert samples[0].utilization == 3.0
    assert samples[0].memory_used_bytes == 1024 * 2**20
    assert samples[0].memory_total_bytes == 81559 * 2**20
    assert samples[1].utilization == 100.0  # says nothing: counted busy
    assert samples[2].utilization == pytest.approx(0.5 * 80 + 0.5 * 100)
    assert samples[3].utilization == 0.0  # nobody holds it


def test_a_workload_reads_as_busy_as_the_busiest_device_it_holds() -> None:
    from spoke.activity import workload_utilisation

    allocations = {
        "gang": (1, (Assignment(node="n0", devices=(0, 1)),)),
        "share": (1, (Assignment(node="n0", devices=(2,), fraction=0.5),)),
        "unread": (1, (Assignment(node="n1", devices=(0,)),)),
    }
    samples = [sample(0, 2.0), sample(1, 40.0), sample(2, 3.0), sample(3, 99.0)]
    assert workload_utilisation(samples, allocations) == {"gang": 40.0, "share": 3.0}


async def test_simulated_gpus_know_each_sharers_own_load(tmp_path: Path) -> None:
    telemetry = SimulatedTelemetry(tmp_path)
    allocations = {
        "quiet": (1, (Assignment(node="n0", devices=(0,), fraction=0.5),)),
        "busy": (1, (Assignment(node="n0", devices=(0,), fraction=0.5),)),
    }
    telemetry.load_file("quiet").write_text("2\n")
    [device, *_] = await telemetry.sample([NODE], allocations)
    assert device.utilization == 51.0  # the device: both shares together
    assert telemetry.workload_utilisation(allocations) == {"quiet": 2.0, "busy": 100.0}
