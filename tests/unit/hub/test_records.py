"""`Records` notes every workload that moved, however the dict is changed, and only those."""

from __future__ import annotations

from hub import transitions
from hub.core.lifecycle import EndReason
from hub.records import Records, WorkloadRecord
from schemas import Assignment, WorkloadSpec


def _record(wid: str) -> WorkloadRecord:
    spec = WorkloadSpec(name=wid, team="a", command=["true"])
    return WorkloadRecord(id=wid, spec=spec, submitted_at=0.0)


def test_every_way_in_or_out_of_the_dict_is_noted() -> None:
    records = Records([_record("a"), _record("b")])
    assert records.take_moved() == {"a", "b"}
    assert records.take_moved() == set()

    records.update({"c": _record("c")})
    assert records.setdefault("d", _record("d")).id == "d"
    assert records.take_moved() == {"c", "d"}
    records.setdefault("d", _record("d"))  # there already: nothing moved
    assert records.take_moved() == set()

    del records["a"]
    records.pop("b")
    records.pop("nobody", None)
    assert records.take_moved() == {"a", "b"}
    assert records.popitem()[0] == "d"
    records.clear()
    assert records.take_moved() == {"c", "d"}
    assert records == {}


def test_a_record_tells_while_it_is_held_and_not_after() -> None:
    records = Records()
    w = _record("w")
    records["w"] = w
    records.take_moved()

    w.reason = "waiting"  # not what a view is made of
    assert records.take_moved() == set()
    transitions.place(w, "s1", (Assignment(node="n0", devices=(0,)),), 1.0)
    assert records.take_moved() == {"w"}
    w.rejected_by = ["s1"]
    assert records.take_moved() == {"w"}

    again = w.model_copy()
    records["w"] = again  # replaced: the old object no longer tells
    records.take_moved()
    transitions.start(w, 2.0)
    assert records.take_moved() == set()
    transitions.start(again, 2.0)
    assert records.take_moved() == {"w"}

    records.pop("w")
    records.take_moved()
    transitions.end(again, EndReason.SUCCEEDED, 3.0, "")
    assert records.take_moved() == set()
