"""A spoke that refuses a placement because it is fenced (it has not heard the hub's lease
acks for fence_after, while the hub still hears it) costs the workload no restart, and gets
no more placements until it reports again: once it hears the hub, the work runs there.

Before, each such refusal counted as `rejected` (one restart) and the hub placed it again at
once: a row of refusals within one short deafness failed a `restart_policy: on_failure`
workload, which bench/recovery.py once saw as a killed spoke's workload never run again."""

from __future__ import annotations

import structlog

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


async def test_refusals_of_a_fenced_spoke_cost_no_restart_and_the_work_runs_after(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 8, "H100"))
    await fed.wait_spokes(1)
    spoke.fence.overdue = lambda now: True  # type: ignore[method-assign]  # deaf to acks
    with structlog.testing.capture_logs() as logs:
        wid = await fed.submit(
            name="movable",
            team="drill",
            command=["sleep", "300"],
            restart_policy="on_failure",
            max_restarts=1,
        )
        refusals = lambda: sum(e["event"] == "placement_refused" for e in logs)  # noqa: E731
        await wait_until(lambda: refusals() >= 3, 30, "three refusals of the fenced spoke")
    del spoke.fence.overdue  # it hears the hub again

    record = await fed.wait_phase(wid, {Phase.RUNNING})
    ended = [a["end_reason"] for a in record["attempts"][:-1]]
    assert len(ended) >= 3 and set(ended) == {"preempted"}
    assert all(e["reason"] == "fenced" for e in logs if e["event"] == "placement_refused")
