"""Burst's port to clouds: the Provisioner, and the plain data it takes and returns."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from burst.core.model import Launch, OfferKey
from schemas.burst import InstanceEvent, InstanceState, Market


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """One instance to start. `burst_id` is the idempotency key and the spoke's id.

    `spoke_creds` is the NATS credential (a `.creds` text) minted for this instance alone,
    confined to its spoke id's subjects and revoked when it is released; the provider hands it
    to the instance as a file (mode 0600), never on a command line, never logged. None: the
    bus has no auth (a test server).
    """

    burst_id: str
    instance_type: str
    region: str
    market: Market
    team: str
    price_per_hour: float
    gpu_model: str
    gpu_count: int
    spoke_creds: str | None
    workload_ids: tuple[str, ...] = ()

    @classmethod
    def from_launch(cls, launch: Launch, spoke_creds: str | None) -> LaunchRequest:
        """The request that carries out a planned launch."""
        return cls(
            burst_id=launch.request_id,
            instance_type=launch.instance_type,
            region=launch.region,
            market=launch.market,
            team=launch.team,
            price_per_hour=launch.price_per_hour,
            gpu_model=launch.gpu_model,
            gpu_count=launch.gpu_count,
            spoke_creds=spoke_creds,
            workload_ids=launch.workload_ids,
        )

    @property
    def offer(self) -> OfferKey:
        return OfferKey(self.instance_type, self.region, self.market)

    def __repr__(self) -> str:  # keep the credential out of logs and tracebacks
        return f"LaunchRequest(burst_id={self.burst_id!r}, instance_type={self.instance_type!r})"


class CredentialIssuer(Protocol):
    """Mints and revokes the NATS credential of one burst instance's spoke."""

    def mint(self, spoke_id: str, now: float) -> str:
        """The `.creds` text for spoke `spoke_id`, valid from `now` for a bounded time."""
        ...

    async def revoke(self, spoke_ids: list[str], now: float) -> None:
        """Revoke every credential minted for these ids (idempotent; returns when in force).

        Raises an exception when the bus cannot be reached: the caller retries later.
        """
        ...


@dataclass(frozen=True, slots=True)
class InstanceInfo:
    """A burst instance as the provider sees it.

    `state` is the machine's: REQUESTED while the provider starts it, RUNNING once it is up
    (whether its spoke joined is the hub's knowledge), TERMINATING, TERMINATED.
    """

    burst_id: str
    provider: str
    provider_instance_id: str
    instance_type: str
    region: str
    zone: str
    market: Market
    team: str
    state: InstanceState
    launched_at: float | None
    price_per_hour: float = 0.0
    gpu_model: str = ""
    gpu_count: int = 0

    def to_event(self, at: float, reason: str = "") -> InstanceEvent:
        """The `gpufed.v1.burst.instances` message telling the hub about this instance."""
        return InstanceEvent(
            burst_id=self.burst_id,
            provider=self.provider,
            instance_type=self.instance_type,
            region=self.region,
            zone=self.zone,
            market=self.market,
            gpu_model=self.gpu_model,
            gpu_count=self.gpu_count,
            price_per_hour=self.price_per_hour,
            team=self.team,
            state=self.state,
            reason=reason,
            at=at,
            provider_instance_id=self.provider_instance_id,
        )


class Provisioner(Protocol):
    """Starts and stops cloud instances for burst. All calls may raise BurstError subclasses."""

    @property
    def name(self) -> str:
        """Provider name as it appears in events (`aws`, `local`)."""
        ...

    async def launch(self, request: LaunchRequest) -> InstanceInfo:
        """Ask for one instance; returns once the provider accepted it, not once it has booted.

        Idempotent per `request.burst_id`: launching an id again returns the instance that id
        made (whatever its state now) and starts nothing. Raises InsufficientCapacityError when
        the offer has no capacity now (block it, try the next), InstanceLimitError when an
        account quota is reached, UnauthorizedError, or another Permanent/RetryableBurstError.
        """
        ...

    async def describe(self, burst_ids: Sequence[str]) -> list[InstanceInfo]:
        """The instances made for these burst ids. Read-only; unknown ids are left out."""
        ...

    async def terminate(self, burst_ids: Sequence[str]) -> list[InstanceInfo]:
        """Ask the provider to terminate these instances; returns before they are gone.

        Idempotent: unknown and already terminated ids are a no-op. Returns the instances it
        asked to stop (as they were before the call).
        """
        ...

    async def sweep_orphans(
        self, known_burst_ids: Collection[str], now: float, grace_s: float
    ) -> list[InstanceInfo]:
        """Terminate live instances burst manages that no record knows about.

        Only instances tagged as gpufed-managed by this deployment, whose burst id is not in
        `known_burst_ids` and that were launched more than `grace_s` before `now` (so one being
        recorded right now is spared). Returns what it terminated; idempotent.
        """
        ...
