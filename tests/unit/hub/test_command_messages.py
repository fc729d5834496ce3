"""A cycle's commands as messages: per spoke in order, within the limits, each read back whole,
and one message id always meaning the same commands."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hub.publishing import command_messages
from hub.records import DecisionRecord
from schemas import Assignment, CancelCommand, PlaceCommand, WorkloadSpec, parse_commands
from schemas.commands import MAX_COMMANDS_PER_MESSAGE


def _decision(spoke: str, n: int, place: bool = True) -> DecisionRecord:
    command: PlaceCommand | CancelCommand
    if place:
        command = PlaceCommand(
            decision_id=f"w{n}-e1-place",
            workload_id=f"w{n}",
            epoch=1,
            spec=WorkloadSpec(name="t", team="t", command=["true"]),
            assignments=(Assignment(node=f"{spoke}-n0", devices=(0,)),),
        )
    else:
        command = CancelCommand(decision_id=f"w{n}-e1-cancel", workload_id=f"w{n}", epoch=1)
    return DecisionRecord(
        decision_id=command.decision_id,
        workload_id=command.workload_id,
        spoke_id=spoke,
        subject=f"gpufed.v1.spoke.{spoke}.commands",
        payload=command.model_dump_json().encode(),
        created_at=1.0,
    )


@given(st.lists(st.tuples(st.sampled_from(["eu-1", "us-1"]), st.booleans()), max_size=200))
def test_each_spokes_commands_arrive_once_in_order_within_the_limits(
    made: list[tuple[str, bool]],
) -> None:
    decisions = [_decision(spoke, n, place) for n, (spoke, place) in enumerate(made)]
    messages = command_messages(decisions)
    for spoke in ("eu-1", "us-1"):
        subject = f"gpufed.v1.spoke.{spoke}.commands"
        sent = [
            c.decision_id
            for (to, payload, _), _ in messages
            if to == subject
            for c in parse_commands(payload)
        ]
        assert sent == [d.decision_id for d in decisions if d.subject == subject]
    for (_, payload, msg_id), held in messages:
        commands = parse_commands(payload)
        assert [c.decision_id for c in commands] == [d.decision_id for d in held]
        assert len(commands) <= MAX_COMMANDS_PER_MESSAGE
        assert len({d.subject for d in held}) == 1
        if len(held) == 1:
            assert msg_id == held[0].decision_id and payload == held[0].payload
    ids = [msg_id for (_, _, msg_id), _ in messages]
    assert len(ids) == len(set(ids))


def test_one_id_means_the_same_commands() -> None:
    abc = [_decision("eu-1", n) for n in range(3)]
    ac = [abc[0], abc[2]]
    again = command_messages(list(abc))
    assert command_messages(abc)[0][0] == again[0][0]
    assert command_messages(ac)[0][0][2] != command_messages(abc)[0][0][2]
