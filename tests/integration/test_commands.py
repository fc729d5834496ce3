"""The spoke's side of the command stream: duplicates, staleness, malformed commands."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from nats.aio.msg import Msg

from bus.client import Bus
from schemas import Assignment, PlaceCommand, WorkloadEvent, WorkloadSpec, parse_events, subjects
from schemas.common import json_array
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until


async def _bus(fed: InProcessFederation) -> Bus:
    bus = Bus(fed.tool_settings())
    await bus.connect()
    await bus.ensure_streams()
    return bus


async def _collect_events(bus: Bus, spoke_id: str) -> list[WorkloadEvent]:
    """Every event the spoke publishes from now on, in order."""
    events: list[WorkloadEvent] = []

    async def collect(msg: Msg) -> None:
        events.extend(parse_events(msg.data))  # one, or several in order

    await bus.nc.subscribe(subjects.events(spoke_id), cb=collect)
    return events


def _place(
    tmp_path: Path,
    epoch: int = 1,
    decision: str = "wdup-e1-place",
    workload: str = "wdup",
    device: int = 0,
    line: str = "ran",
) -> PlaceCommand:
    """A Place of a workload that writes `line` to ran.log under `tmp_path` when it runs."""
    spec = WorkloadSpec(
        name="dup", team="t", command=("sh", "-c", f"echo {line} >> {tmp_path / 'ran.log'}")
    )
    return PlaceCommand(
        decision_id=decision,
        workload_id=workload,
        epoch=epoch,
        spec=spec,
        assignments=(Assignment(node="eu-1-n0", devices=(device,)),),
    )


async def test_same_decision_published_twice_runs_once(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    bus = await _bus(fed)
    events = await _collect_events(bus, "eu-1")
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    command = _place(tmp_path).model_dump_json().encode()
    subject = subjects.commands("eu-1")
    first = await bus.publish_durable(subject, command, "wdup-e1-place")
    second = await bus.publish_durable(subject, command, "wdup-e1-place")
    assert second.duplicate and not first.duplicate  # JetStream dropped the repeat
    # Past JetStream's dedupe window the same decision can arrive under another message id.
    await bus.publish_durable(subject, command, "wdup-e1-place-resent")
    await wait_until(lambda: sum(e.phase == "succeeded" for e in events) >= 1)
    await wait_until(lambda: spoke.counters["duplicate"] == 1)
    await asyncio.sleep(0.3)
    assert (tmp_path / "ran.log").read_text().splitlines() == ["ran"]
    assert [e.phase.value for e in events] == ["running", "succeeded"]
    await bus.close()


async def test_commands_several_to_a_message_each_run_once_even_sent_again(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    bus = await _bus(fed)
    events = await _collect_events(bus, "eu-1")
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    subject = subjects.commands("eu-1")
    places = [
        _place(tmp_path, decision=f"{wid}-e1-place", workload=wid, device=device, line=wid)
        for wid, device in (("wone", 0), ("wtwo", 1))
    ]
    message = json_array([p.model_dump_json().encode() for p in places])
    await bus.publish_durable(subject, message, "both")
    await wait_until(lambda: sum(e.phase == "succeeded" for e in events) >= 2)
    # The same commands in a message of another id (a hub that restarted): dropped, each.
    await bus.publish_durable(subject, message, "both-resent")
    await wait_until(lambda: spoke.counters["duplicate"] == 2)
    await asyncio.sleep(0.3)
    assert sorted((tmp_path / "ran.log").read_text().splitlines()) == ["wone", "wtwo"]
    assert spoke.journal.state.applied_seq >= 2  # the message's sequence, noted once all ran
    await bus.close()


async def test_older_epoch_is_never_run(fed: InProcessFederation, tmp_path: Path) -> None:
    bus = await _bus(fed)
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    subject = subjects.commands("eu-1")
    newer = _place(tmp_path, epoch=2, decision="wdup-e2-place")
    older = _place(tmp_path, epoch=1, decision="wdup-e1-place")
    await bus.publish_durable(subject, newer.model_dump_json().encode(), newer.decision_id)
    await bus.publish_durable(subject, older.model_dump_json().encode(), older.decision_id)
    await wait_until(lambda: spoke.counters["stale"] == 1)
    await wait_until(lambda: (tmp_path / "ran.log").exists())
    await asyncio.sleep(0.3)
    assert (tmp_path / "ran.log").read_text().splitlines() == ["ran"]
    await bus.close()


async def test_malformed_command_is_acked_and_counted(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    bus = await _bus(fed)
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    subject = subjects.commands("eu-1")
    await bus.publish_durable(subject, b"{not json", "garbage-1")
    await bus.publish_durable(subject, json.dumps({"kind": "place"}).encode(), "garbage-2")
    await wait_until(lambda: spoke.counters["malformed"] == 2)
    # Still serving: a good command after the bad ones runs.
    good = _place(tmp_path)
    await bus.publish_durable(subject, good.model_dump_json().encode(), good.decision_id)
    await wait_until(lambda: (tmp_path / "ran.log").exists())
    info = await bus.js.consumer_info(subjects.COMMANDS_STREAM, subjects.spoke_consumer("eu-1"))
    assert info.num_redelivered == 0
    await bus.close()


async def test_assignment_of_a_busy_device_is_rejected(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    bus = await _bus(fed)
    events = await _collect_events(bus, "eu-1")
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    subject = subjects.commands("eu-1")
    spec = WorkloadSpec(name="a", team="t", command=("sleep", "5"))
    for wid in ("wa", "wb"):
        cmd = PlaceCommand(
            decision_id=f"{wid}-e1-place",
            workload_id=wid,
            epoch=1,
            spec=spec,
            assignments=(Assignment(node="eu-1-n0", devices=(1,)),),
        )
        await bus.publish_durable(subject, cmd.model_dump_json().encode(), cmd.decision_id)
    await wait_until(lambda: any(e.phase == "rejected" for e in events))
    rejected = next(e for e in events if e.phase == "rejected")
    assert rejected.workload_id == "wb"
    assert "device 1 of node eu-1-n0 is in use" in rejected.message
    await bus.close()


async def test_command_of_a_deposed_hub_is_never_applied(
    fed: InProcessFederation, tmp_path: Path
) -> None:
    bus = await _bus(fed)
    spoke = await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    subject = subjects.commands("eu-1")
    new_leader = _place(tmp_path).model_copy(update={"term": 3})
    old_leader = _place(tmp_path, epoch=2, decision="wdup-e2-place").model_copy(update={"term": 2})
    await bus.publish_durable(subject, new_leader.model_dump_json().encode(), "t3")
    await wait_until(lambda: (tmp_path / "ran.log").exists())
    # A newer epoch, but from the hub of an older term: never run, not even to supersede.
    await bus.publish_durable(subject, old_leader.model_dump_json().encode(), "t2")
    await wait_until(lambda: spoke.counters["stale_term"] == 1)
    await asyncio.sleep(0.3)
    assert (tmp_path / "ran.log").read_text().splitlines() == ["ran"]
    assert spoke.fence.term == 3
    await bus.close()
