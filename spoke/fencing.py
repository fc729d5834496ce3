"""Execution fencing: when did this spoke last hear the hub, and must it stop movable work?

The hub answers every capacity report it processes with a LeaseAck. The spoke counts the hub
as heard at the moment it *sent* the acknowledged report: that is never later than when the
hub saw the report, so `sent + fence_after` always comes before the hub's `seen + lost_after`.
Once nothing was acknowledged for `fence_after`, the spoke stops the work the hub would run
elsewhere after `lost_after`, and starts no such work, until it hears the hub again.

`fence_after` is the hub's `lost_after` (sent in every ack) less the stop grace and three
heartbeats, so the work is gone before the hub may move it; a spoke setting can only lower it.
The state survives a restart of the spoke (a small JSON file), so adopted work stays fenced.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import structlog

from schemas import LeaseAck

log = structlog.get_logger(__name__)

#: Reports whose send time is remembered (acks of older ones are ignored).
SENT_KEPT = 256
#: Heartbeats between fencing and the hub's lost_after deadline, beside the stop grace.
MARGIN_HEARTBEATS = 3
#: What a workload's log says when the rule stops it without its spoke (a local watchdog, a
#: Slurm job's lease): its owner reads why it ended there.
STOPPED_WITHOUT_SPOKE = (
    "gpufed: the spoke has not heard the hub for fence_after: stopping this job "
    "(it runs again elsewhere)"
)


def fence_file(workdir: Path) -> Path:
    """Where a spoke keeps its fence state (its watchdog reads it too)."""
    return workdir / "fence.json"


@dataclass(frozen=True)
class Guard:
    """What a runtime needs to apply the spoke's rule without the spoke (a local watchdog, a
    Slurm job's lease): where its fence state is, and the rule's figures."""

    fence_path: Path
    heartbeat_s: float
    stop_grace_s: float
    fence_after_s: float | None = None

    def read(self) -> Fence:
        """The spoke's fence state as last saved."""
        return Fence(
            self.fence_path,
            heartbeat_s=self.heartbeat_s,
            stop_grace_s=self.stop_grace_s,
            fence_after_s=self.fence_after_s,
        )


class Fence:
    """The spoke's lease on its work, as far as it can tell from the hub's acknowledgements."""

    def __init__(
        self,
        path: Path,
        *,
        heartbeat_s: float,
        stop_grace_s: float,
        fence_after_s: float | None = None,
    ) -> None:
        self.path = path
        self.heartbeat_s = heartbeat_s
        self.stop_grace_s = stop_grace_s
        self.limit_s = fence_after_s
        self.heard_at: float | None = None
        self.lost_after_s: float | None = None
        self.kept: set[str] = set()  # running workloads fencing leaves alone
        self.term = 0  # the newest hub term heard: commands and acks of older ones are ignored
        self.stopped: set[str] = set()  # fenced during the current silence
        self.unanswered = False  # the last report found no hub to answer it
        self._sent: OrderedDict[int, float] = OrderedDict()
        self._dirty = False
        self._load()

    def sent(self, seq: int, at: float) -> None:
        """Report `seq` of this incarnation went out at `at`."""
        self._sent[seq] = at
        while len(self._sent) > SENT_KEPT:
            self._sent.popitem(last=False)

    def acked(self, ack: LeaseAck) -> bool:
        """Take the hub's ack of one of our reports; True when it renews the lease."""
        at = self._sent.get(ack.seq)
        if at is None or ack.term < self.term:
            return False  # not ours, or from a hub deposed since
        self.saw_term(ack.term)
        if self.heard_at is None or at > self.heard_at:
            self.heard_at = at
            self._dirty = True
        if ack.lost_after_s != self.lost_after_s:
            self.lost_after_s = ack.lost_after_s
            self._dirty = True
        if self.stopped or self.unanswered:
            log.info("hub_heard_again", fenced=len(self.stopped))
            self.stopped.clear()
        self.unanswered = False
        return True

    def no_hub(self, now: float) -> None:
        """A report found no hub to answer it (NATS "no responders"): not an ack, so the
        silence, and the clock towards fence_after, go on. Logged once per silence."""
        if self.unanswered:
            return
        self.unanswered = True
        if self.heard_at is None:  # up before its hub (`gpufed up`, a fresh cluster): no lease
            log.info("hub_not_up_yet")  # to lose, nothing to fence
            return
        silent = round(now - self.heard_at, 1)
        log.warning("hub_not_reachable", silent_s=silent, fence_after_s=self.fence_after_s)

    def saw_term(self, term: int) -> None:
        """A command or ack of hub term `term` was taken."""
        if term > self.term:
            self.term = term
            self._dirty = True

    @property
    def fence_after_s(self) -> float | None:
        """Silence after which movable work stops; None before the hub was ever heard."""
        if self.lost_after_s is None:
            return self.limit_s
        margin = self.stop_grace_s + MARGIN_HEARTBEATS * self.heartbeat_s
        derived = max(2 * self.heartbeat_s, self.lost_after_s - margin)
        return derived if self.limit_s is None else min(self.limit_s, derived)

    def deadline(self) -> float | None:
        """When movable work stops unless the hub is heard before: heard_at + fence_after
        (None: the hub never heard, nothing to fence)."""
        after = self.fence_after_s
        return None if self.heard_at is None or after is None else self.heard_at + after

    def overdue(self, now: float) -> bool:
        """Whether the hub has not been heard for fence_after."""
        deadline = self.deadline()
        return deadline is not None and now > deadline

    def to_stop(self, running: Iterable[str], now: float) -> list[str]:
        """Running workloads to stop now (each once per silence); none while the hub is heard."""
        if not self.overdue(now):
            return []
        due = sorted(w for w in running if w not in self.kept and w not in self.stopped)
        for wid in due:
            self.stopped.add(wid)
            log.warning(
                "fencing_workload",
                workload=wid,
                silent_s=round(now - (self.heard_at or 0.0), 1),
                fence_after_s=self.fence_after_s,
            )
        return due

    def placed(self, workload_id: str, fenced: bool) -> None:
        """Remember whether a workload just started is stopped by fencing."""
        if not fenced:
            self.kept.add(workload_id)
            self._dirty = True

    def ended(self, workload_id: str) -> None:
        if workload_id in self.kept:
            self.kept.discard(workload_id)
            self._dirty = True
        self.stopped.discard(workload_id)

    def save(self) -> None:
        """Write the state if it changed (cheap when it did not)."""
        if not self._dirty:
            return
        self._dirty = False
        state = {
            "heard_at": self.heard_at,
            "lost_after_s": self.lost_after_s,
            "kept": sorted(self.kept),
            "term": self.term,
        }
        tmp = self.path.with_suffix(".tmp")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.path)

    def _load(self) -> None:
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            state = json.loads(self.path.read_text())
            self.heard_at = float(state["heard_at"]) if state.get("heard_at") else None
            lost = state.get("lost_after_s")
            self.lost_after_s = float(lost) if lost else None
            # Work placed after the last save is unknown here: it is fenced (the safe side).
            self.kept = {str(w) for w in state.get("kept", [])}
            self.term = int(state.get("term", 0))


class OwnStalls:
    """Tells the fence loop when a silence was the spoke's own: its checks, `every_s` apart,
    held up for over two of them (a collector's pause, a paused VM, a machine out of CPU).
    Such a silence sent no reports either, so the hub heard nothing of it and may still count
    the spoke alive: the spoke reports at once and holds its fencing for `hold_s` (a
    heartbeat) for the hub to answer. fence_after leaves three heartbeats before the hub's
    lost_after; a hub that still answers nothing is fenced against one heartbeat later."""

    def __init__(self, every_s: float, hold_s: float, now: float) -> None:
        self.every_s = every_s
        self.hold_s = hold_s
        self._checked = now
        self._held_until = now

    def holds(self, now: float, overdue: bool) -> bool:
        """Whether fencing waits at this check (`now`: a monotonic clock); True at once when
        the lease is `overdue` just after a stall (report now), then for `hold_s`."""
        stalled = now - self._checked > 2 * self.every_s
        self._checked = now
        if stalled and overdue:
            self._held_until = now + self.hold_s
            return True
        return now < self._held_until
