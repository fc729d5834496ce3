"""gpufed's JetStream streams: commands to spokes, events from them, burst instances."""

from __future__ import annotations

from nats.js.api import ExternalStream, StreamConfig, StreamSource

from schemas import burst, subjects

#: How long JetStream remembers a Nats-Msg-Id; a retried publish inside it is dropped as a repeat.
DUPLICATE_WINDOW_S = 120.0


def stream_configs(event_domains: tuple[str, ...] = ()) -> list[StreamConfig]:
    """The streams the hub creates or updates at start (`Bus.ensure_streams`)."""
    sources = [
        StreamSource(name=subjects.EVENTS_STREAM, external=ExternalStream(api=f"$JS.{domain}.API"))
        for domain in event_domains
    ]
    return [
        StreamConfig(
            name=subjects.COMMANDS_STREAM,
            subjects=[subjects.COMMANDS_SUBJECTS],
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=7 * 24 * 3600.0,
        ),
        StreamConfig(
            name=subjects.EVENTS_STREAM,
            subjects=[subjects.EVENTS_SUBJECTS],
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=7 * 24 * 3600.0,
            sources=sources or None,
        ),
        StreamConfig(
            name=burst.BURST_STREAM,
            subjects=[burst.BURST_INSTANCES],
            duplicate_window=DUPLICATE_WINDOW_S,
            max_age=30 * 24 * 3600.0,
        ),
    ]
