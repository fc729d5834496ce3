"""A batch's reply fits the message that carries it: over NATS a reply past the server's
`max_payload` is never sent, and the sender of 10,000 specs, whose work was taken, hears
nothing. Shortened, it still says of each item whether it was taken, its id, and why not."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import SubmitReply
from schemas.errors import ErrorReply
from schemas.workloads import SubmitBatchReply

_LONG = "priority class 'urgent' is not defined (known: " + ", ".join(["x" * 20] * 10) + ")"


def _reply(items: list[int]) -> SubmitBatchReply:
    """0: taken; 1: the same long refusal as others; 2: a refusal of its own."""
    results = []
    for at, kind in enumerate(items):
        if kind == 0:
            results.append(SubmitReply(ok=True, workload_id=f"w{at:023x}"))
        else:
            message = _LONG if kind == 1 else f"{_LONG} ({at})"
            error = ErrorReply(code="invalid_workload", message=message, field="priority_class")
            results.append(SubmitReply(ok=False, error=error))
    accepted = items.count(0)
    return SubmitBatchReply(
        results=tuple(results), accepted=accepted, refused=len(items) - accepted
    )


def test_a_reply_that_fits_is_whole() -> None:
    reply = _reply([0, 1, 1, 2])
    assert SubmitBatchReply.model_validate_json(reply.encode(1 << 20)) == reply


def test_a_refusal_said_before_points_to_the_item_that_said_it() -> None:
    reply = _reply([1] * 2000)  # about 500 KB whole
    data = reply.encode(250_000)
    assert len(data) <= 250_000
    back = SubmitBatchReply.model_validate_json(data)
    assert back.results[0].error == reply.results[0].error  # the first says it whole
    assert {r.error.message for r in back.results[1:] if r.error} == {"as item 0"}
    assert (back.accepted, back.refused) == (0, 2000)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.sampled_from([0, 1, 2]), max_size=400), limit=st.integers(0, 200_000))
def test_shortened_each_item_still_says_whether_it_was_taken_its_id_and_why_not(
    items: list[int], limit: int
) -> None:
    reply = _reply(items)
    data = reply.encode(limit)
    back = SubmitBatchReply.model_validate_json(data)
    # Fits, unless it could not: every message left empty is the shortest it gets.
    assert len(data) <= limit or all(r.error is None or not r.error.message for r in back.results)
    assert (back.accepted, back.refused) == (reply.accepted, reply.refused)
    for was, now in zip(reply.results, back.results, strict=True):
        assert (now.ok, now.workload_id) == (was.ok, was.workload_id)
        if was.error is not None:
            assert now.error is not None
            assert (now.error.code, now.error.field) == (was.error.code, was.error.field)
            assert was.error.message.startswith(now.error.message) or now.error.message.startswith(
                "as item"
            )
