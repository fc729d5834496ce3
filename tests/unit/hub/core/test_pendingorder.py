"""The kept pending queue (hub.core.pendingorder) gives `queue_order`'s order at every step.

Random queues go through random steps: workloads queued (one or hundreds at once), placed
(one or hundreds), changed (a claim on freed devices, a new view of the same workload), time
passing across aging intervals, and policy changes (classes whose aged priorities meet in one
band, aging off). After each step both orders are read with the same share function, which
changes as the consumer takes entries (as the ledger's shares do during a plan), and must list
the same workloads in the same order. Half the steps tell the kept queue what changed, the
other half let it read the queue through.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.fairshare import Entry, ShareOf, queue_order
from hub.core.model import Workload
from hub.core.pendingorder import KeptQueue
from hub.core.policy import Aging, Policy, PriorityClass
from tests.unit.hub.core.builders import spec

TEAMS = ("a", "b", "c")
CLASSES = (
    PriorityClass("low", 100),
    PriorityClass("mid", 150, preemptible=True),
    PriorityClass("high", 400),
    PriorityClass("top", 1000, preemptible=False),
)
POLICIES = (
    Policy(classes=CLASSES, aging=Aging(interval_s=100.0, step=25)),
    Policy(classes=CLASSES, aging=Aging(interval_s=100.0, step=0)),
    Policy(classes=CLASSES[:3], aging=Aging(interval_s=50.0, step=50)),
    Policy(classes=(replace(CLASSES[0], value=150), *CLASSES[1:])),
)
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def read(order: Iterator[Entry], taken: dict[str, float]) -> list[str]:
    """The ids in order; every third entry taken raises its team's share (read between)."""
    ids = []
    for n, entry in enumerate(order):
        ids.append(entry[1])
        if n % 3 == 0:
            team = entry[3].spec.team
            taken[team] = taken.get(team, 0.0) + 1.0
    return ids


def share_of(taken: dict[str, float]) -> ShareOf:
    return lambda team: (taken.get(team, 0.0), float(TEAMS.index(team)))


def same_orders(queue: KeptQueue, pending: list[Workload], policy: Policy, now: float) -> None:
    classes = {c.name: c for c in reversed(policy.classes)}
    entries = [
        (w, classes[w.spec.priority_class]) for w in pending if w.spec.priority_class in classes
    ]
    taken: dict[str, float] = {}
    expected = read(queue_order(entries, policy, now, share_of(taken)), taken)
    taken = {}
    assert read(queue.order(policy, now, share_of(taken)), taken) == expected
    unknown = [w for w in pending if w.spec.priority_class not in classes]
    assert queue.unknown() == sorted(unknown, key=lambda w: (w.submitted_at, w.id))


@SETTINGS
@given(st.data())
def test_the_kept_queue_orders_as_queue_order(data: st.DataObject) -> None:
    pending: dict[str, Workload] = {}
    told: dict[str, Workload | None] = {}
    queue = KeptQueue()
    now = 10_000.0
    serial = 0
    policy = POLICIES[0]
    for _ in range(data.draw(st.integers(1, 30))):
        what = data.draw(st.sampled_from(("queue", "queue", "place", "change", "time", "policy")))
        if what == "queue":  # a few of any kind, or a sweep of one team and class
            count = data.draw(st.sampled_from((1, 2, 5, 200)))
            team = data.draw(st.sampled_from(TEAMS))
            cls = data.draw(st.sampled_from((*(c.name for c in CLASSES), "nope")))
            for _ in range(count):
                serial += 1
                if count < 200:
                    team = data.draw(st.sampled_from(TEAMS))
                    cls = data.draw(st.sampled_from((*(c.name for c in CLASSES), "nope")))
                ago = data.draw(st.sampled_from((0.0, 0.0, 99.0, 100.0, 250.0, 1e4)))
                w = Workload(f"w{serial:04d}", spec(team=team, cls=cls), now - ago)
                pending[w.id] = told[w.id] = w
        elif what == "place" and pending:
            count = data.draw(st.sampled_from((1, 3, 150)))
            for wid in data.draw(st.permutations(sorted(pending)))[:count]:
                del pending[wid]
                told[wid] = None
        elif what == "change" and pending:
            wid = data.draw(st.sampled_from(sorted(pending)))
            w = pending[wid]
            pending[wid] = told[wid] = replace(w, claims_freed=data.draw(st.booleans()))
        elif what == "time":
            now += data.draw(st.sampled_from((1.0, 50.0, 100.0, 1000.0)))
        elif what == "policy":
            policy = data.draw(st.sampled_from(POLICIES))
        queued = list(pending.values())
        classes = {c.name: c for c in reversed(policy.classes)}
        says = told if data.draw(st.booleans()) else None
        assert queue.sync(queued, classes, says)
        told = {}
        same_orders(queue, queued, policy, now)
    assert queue.untold == 0  # told everything: never read through for a miss


def test_a_repeated_id_is_not_kept() -> None:
    w = Workload("w", spec(), 0.0)
    queue = KeptQueue()
    classes = {c.name: c for c in Policy().classes}
    assert not queue.sync([w, replace(w, submitted_at=1.0)], classes)
    assert not queue.sync([w, w], classes)
    assert queue.sync([w], classes)


def test_a_told_list_that_misses_a_placement_is_not_trusted() -> None:
    a, b = Workload("a", spec(), 0.0), Workload("b", spec(), 1.0)
    queue = KeptQueue()
    policy = Policy()
    classes = {c.name: c for c in policy.classes}
    assert queue.sync([a, b], classes)
    assert queue.sync([b], classes, {})  # `a` left untold: the count shows it
    assert queue.untold == 1
    assert [e[1] for e in queue.order(policy, 10.0, lambda team: (0.0, 0.0))] == ["b"]
