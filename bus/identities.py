"""Who may do what on NATS: the permissions of the hub, the burst controller and each spoke.

Every identity receives only below its own inbox prefix (see `inbox_prefix`),
so no one reads another's replies; `_INBOX.>` is open to nobody. Replies to requests go out
through `allow_responses` (one reply per request received), never a publish right on inboxes.
"""

from __future__ import annotations

from bus.jwt import Permissions
from schemas import burst, subjects

HUB = "hub"
BURST = "burst"

_JS = "$JS.API"
_COMMANDS = subjects.COMMANDS_STREAM


def inbox_prefix(identity: str) -> str:
    """The reply-subject prefix an identity connects with (and may subscribe below).

    Spokes get `_INBOX_<id>`; the hub and burst `_INBOX.hub` / `_INBOX.burst`, which no spoke id
    can produce (a spoke named "hub" still cannot read the hub's replies).
    """
    if identity in (HUB, BURST):
        return f"_INBOX.{identity}"
    return f"_INBOX_{identity}"


def hub_permissions() -> Permissions:
    """The hub owns the streams and every gpufed subject; it answers sync and state requests."""
    return Permissions(
        pub_allow=(f"{subjects.PREFIX}.>", f"{_JS}.>", "$JS.ACK.>"),
        sub_allow=(f"{subjects.PREFIX}.>", f"{inbox_prefix(HUB)}.>"),
        responses=True,
    )


def burst_permissions() -> Permissions:
    """The burst controller: reads capacity and demand, asks the hub for state, reports its
    instances on the burst stream and why it rents none for waiting work. It cannot command
    a spoke or speak as one."""
    return Permissions(
        pub_allow=(
            burst.BURST_STATE,
            burst.BURST_INSTANCES,
            burst.BURST_VERDICTS,
            f"{_JS}.STREAM.INFO.{burst.BURST_STREAM}",
        ),
        sub_allow=(
            subjects.CAPACITY_SUBJECTS,
            burst.BURST_DEMAND,
            f"{inbox_prefix(BURST)}.>",
        ),
    )


def spoke_permissions(spoke_id: str) -> Permissions:
    """A spoke: its own capacity, events and sync subjects, and its own durable consumer
    `spoke-<id>` pinned to its own commands (the filter is part of the CREATE subject, so a
    consumer on another spoke's commands is refused); it cannot delete or change consumers."""
    consumer = subjects.spoke_consumer(spoke_id)
    return Permissions(
        pub_allow=(
            subjects.capacity(spoke_id),
            subjects.events(spoke_id),
            subjects.sync(spoke_id),
            f"{_JS}.STREAM.INFO.{_COMMANDS}",
            f"{_JS}.CONSUMER.INFO.{_COMMANDS}.{consumer}",
            f"{_JS}.CONSUMER.CREATE.{_COMMANDS}.{consumer}.{subjects.commands(spoke_id)}",
            f"{_JS}.CONSUMER.MSG.NEXT.{_COMMANDS}.{consumer}",
            f"$JS.ACK.{_COMMANDS}.{consumer}.>",
        ),
        # Its own log subject: the hub asks it for a workload's log and it answers once.
        sub_allow=(f"{inbox_prefix(spoke_id)}.>", subjects.logs(spoke_id)),
        responses=True,
    )


def leaf_permissions(
    spoke_ids: tuple[str, ...], region_domain: str, hub_domain: str = "hub"
) -> Permissions:
    """A region's leaf node, as the hub sees its connection: it carries its spokes' subjects
    and the JetStream calls that mirror the hub's command stream into the region and source
    the region's events into the hub (with their replies and flow control). It may not create,
    change or delete streams at the hub, touch another region's spokes, or publish a command."""
    spokes = tuple(f"{subjects.PREFIX}.spoke.{s}.>" for s in spoke_ids)
    hub_js = f"$JS.{hub_domain}.API"
    return Permissions(
        pub_allow=(
            *spokes,
            f"{hub_js}.CONSUMER.CREATE.{_COMMANDS}.>",
            f"{hub_js}.CONSUMER.INFO.{_COMMANDS}.>",
            f"{hub_js}.CONSUMER.DELETE.{_COMMANDS}.>",
            f"{hub_js}.STREAM.INFO.{_COMMANDS}",
            "$JS.FC.>",
            f"$JS.ACK.{_COMMANDS}.>",
            "_INBOX.>",
        ),
        pub_deny=(subjects.commands("*"),),
        sub_allow=(
            f"$JS.{region_domain}.API.>",
            "$JS.FC.>",
            "_INBOX.>",
            *(f"{inbox_prefix(s)}.>" for s in spoke_ids),
            *spokes,
        ),
    )
