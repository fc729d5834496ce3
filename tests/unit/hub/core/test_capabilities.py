"""Placement never sends work where the spoke's runtime would refuse it, nor back to a refuser."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hub.core.model import Plan, Snapshot, Workload
from hub.core.placement import plan
from hub.core.policy import Policy
from schemas import RuntimeCapabilities, WorkloadKind
from tests.unit.hub.core.builders import check_invariants, fleet, node, pending, placed, spoke, why

NOW = 10_000.0
KUBE = RuntimeCapabilities(fractions=False)
NO_GANGS = RuntimeCapabilities(gangs=False)
SMALL_GANGS = RuntimeCapabilities(max_gang_nodes=2)
SLURM = RuntimeCapabilities(fractions=False, kinds=(WorkloadKind.JOB,))


def run(snapshot: Snapshot, *queue: Workload) -> Plan:
    result = plan(snapshot, queue, [], Policy(), NOW)
    check_invariants(snapshot, queue, [], Policy(), result)
    return result


def two_spokes(caps: RuntimeCapabilities) -> Snapshot:
    # "a-limited" sorts (and so ranks) first: placement would pick it if it could.
    return fleet(
        spoke("a-limited", *(node(f"a{i}") for i in range(3)), capabilities=caps),
        spoke("b-full", *(node(f"b{i}") for i in range(3))),
    )


@pytest.mark.parametrize(
    ("caps", "shape", "expected"),
    [
        (KUBE, {"fraction": 0.5}, "b-full"),
        (KUBE, {"gpus": 2}, "a-limited"),  # whole GPUs run there
        (KUBE, {"nodes": 2}, "a-limited"),
        (NO_GANGS, {"nodes": 2}, "b-full"),
        (NO_GANGS, {"fraction": 0.5}, "a-limited"),
        (SMALL_GANGS, {"nodes": 2}, "a-limited"),
        (SMALL_GANGS, {"nodes": 3}, "b-full"),
    ],
)
def test_work_lands_only_where_the_runtime_runs_it(
    caps: RuntimeCapabilities, shape: dict[str, object], expected: str
) -> None:
    result = run(two_spokes(caps), pending("w", **shape))  # type: ignore[arg-type]
    assert placed(result)["w"][0] == expected


def test_nowhere_to_run_it_says_why() -> None:
    only = fleet(spoke("kube", node("k0"), capabilities=KUBE))
    result = run(only, pending("w", fraction=0.25))
    reason, message = why(result)["w"]
    assert reason == "runtime_refuses"
    assert "fractional" in message


def test_a_spoke_that_refused_a_workload_does_not_get_it_back() -> None:
    snapshot = two_spokes(RuntimeCapabilities())
    assert placed(run(snapshot, pending("w")))["w"][0] == "a-limited"
    w = replace(pending("w"), avoid_spokes=frozenset({"a-limited"}))
    assert placed(run(snapshot, w))["w"][0] == "b-full"


def test_refused_everywhere_stays_pending_with_the_refusers_named() -> None:
    w = replace(pending("w"), avoid_spokes=frozenset({"a-limited", "b-full"}))
    reason, message = why(run(two_spokes(RuntimeCapabilities()), w))["w"]
    assert reason == "runtime_refuses"
    assert "a-limited" in message and "b-full" in message


def test_old_reports_without_capabilities_read_as_runtimes_that_run_everything() -> None:
    from schemas import CapacityReport

    old = {"spoke_id": "s", "region": "eu", "incarnation": "i", "seq": 1, "sent_at": 0.0}
    assert CapacityReport.model_validate(old).capabilities == RuntimeCapabilities()


def session(wid: str) -> Workload:
    w = pending(wid)
    return replace(w, spec=w.spec.model_copy(update={"kind": WorkloadKind.SESSION}))


def test_a_session_goes_only_where_the_runtime_exposes_a_port() -> None:
    assert placed(run(two_spokes(SLURM), session("s")))["s"][0] == "b-full"
    assert placed(run(two_spokes(SLURM), pending("j")))["j"][0] == "a-limited"
    reason, message = why(run(fleet(spoke("hpc", node("h0"), capabilities=SLURM)), session("s")))[
        "s"
    ]
    assert reason == "runtime_refuses"
    assert "does not run sessions" in message
