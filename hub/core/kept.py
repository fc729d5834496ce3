"""What placement keeps between plans on one fleet: signatures, verdicts, orders and the queue.

`hub.core.planstate.PlanState` holds one `Kept` while the fleet's make-up stays the same and
hands it to every plan (`hub.core.placement.plan_on`); a plan from scratch has none.
"""

from __future__ import annotations

from hub.core import explain
from hub.core.fit import Sig, affinity_key
from hub.core.holdings import KeptOrder
from hub.core.model import SpecLike
from hub.core.pendingorder import KeptQueue


class Kept:
    """Per signature, its pools; per signature and shape, why it never fits; running work in
    victim order (`hub.core.victims.KeptOrder`); the pending queue in order.

    Valid while the fleet's make-up (spokes, nodes, models, labels, runtimes) stays the same.
    """

    __slots__ = ("kinds", "never", "order", "queue", "sigs", "specs")

    def __init__(self) -> None:
        self.queue = KeptQueue()
        self.sigs: dict[object, Sig] = {}
        self.never: dict[tuple[object, ...], explain.Why | None] = {}
        self.order = KeptOrder()
        # id(need) -> what is worked out from a pending view's spec alone (`Workload.need`,
        # one per view), for views queued lately
        self.specs: dict[int, SpecInfo] = {}
        # (team, shape, signature) -> a number for it, in a plan's equivalence classes
        self.kinds: dict[tuple[object, ...], int] = {}


class SpecInfo:
    """What a plan works out from a workload's spec alone (kept while its view is queued)."""

    __slots__ = ("akey", "kind", "no_room", "spec")

    def __init__(self, spec: SpecLike) -> None:
        self.spec = spec  # held, so its id stays its own while this is kept
        self.akey = affinity_key(spec)
        self.no_room: explain.Why | None = None  # explain.no_room(spec), once asked
        self.kind = -1  # its team, shape and signature as a number (`Kept.kinds`)
