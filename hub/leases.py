"""Spoke leases: which spokes may get work, and which are lost.

Every capacity report renews its spoke's lease. Past `suspect_after_s` of silence a spoke gets
no new placements; past `lost_after_s` it is lost and its work moves. Expiry is suspended while
the hub itself hears nobody (it was cut off or restarting) and until `lost_after_s` has passed
since it heard spokes again: a hub outage must never cost the spokes their running work.

Plain state and `now` passed in: no clock is read here, so the rules are unit-tested directly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from hub.records import SpokeRecord


class SpokeStatus(StrEnum):
    """A spoke's lease as the API shows it."""

    READY = "ready"
    SUSPECT = "suspect"
    LOST = "lost"


@dataclass
class Leases:
    """The hub's view of how well it hears the spokes."""

    suspect_after_s: float
    lost_after_s: float
    # Since when the hub has heard spokes without a gap; None while it hears nobody.
    hearing_since: float | None = None
    last_any_report: float | None = None
    # Spoke -> when it last refused a placement for its own state (fenced or draining).
    refusals: dict[str, float] = field(default_factory=dict)

    def heard(self, now: float) -> None:
        """A spoke's report arrived at `now`."""
        if self._quiet(now):
            self.hearing_since = now
        self.last_any_report = now

    def expired(
        self, spokes: Iterable[SpokeRecord], now: float, *, connected: bool = True
    ) -> list[SpokeRecord]:
        """The spokes not yet declared lost whose lease ran out at `now`.

        Empty while the hub is not `connected` to the bus or has heard nobody for
        `suspect_after_s`, and until it has heard spokes again for `lost_after_s`.
        """
        if not connected or self._quiet(now):
            self.hearing_since = None
            return []
        if self.hearing_since is None or now - self.hearing_since < self.lost_after_s:
            return []
        return [s for s in spokes if s.lost_at is None and now - s.last_seen >= self.lost_after_s]

    def status(self, spoke: SpokeRecord, now: float) -> SpokeStatus:
        """Ready, suspect or lost, by how long ago the spoke was last heard."""
        age = now - spoke.last_seen
        if age < self.suspect_after_s:
            return SpokeStatus.READY
        if age < self.lost_after_s:
            return SpokeStatus.SUSPECT
        return SpokeStatus.LOST

    def refused(self, spoke_id: str, now: float) -> None:
        """`spoke_id` refused a placement at `now` for its own state (fenced: it has not heard
        the hub's acks; draining): it gets no more until a report of its arrives after that.
        Its refusals are requeued for free, so without this pause the hub would place and
        have refused again as fast as it can while the spoke stays fenced."""
        self.refusals[spoke_id] = now

    def accepts_work(self, spoke: SpokeRecord | None, now: float) -> bool:
        """Whether new placements may go to `spoke` (None: a spoke never heard of)."""
        if spoke is None or now - spoke.last_seen >= self.suspect_after_s:
            return False
        refused = self.refusals.get(spoke.id)
        return refused is None or spoke.last_seen > refused

    def _quiet(self, now: float) -> bool:
        return self.last_any_report is None or now - self.last_any_report > self.suspect_after_s
