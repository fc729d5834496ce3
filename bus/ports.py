"""Free loopback ports for the servers a process starts (NATS, the hub's API, /metrics, a
replica's port).

A port is free when asked for and bound a moment later by the child that gets it, so two asks
must never get the same port: the kernel may hand one out twice while nothing listens on it
yet (`gpufed up` picks the hub's port, then the spokes' /metrics ports, before the hub has
bound its own), and the loser of that race then serves on someone else's port or fails to
start. A port given out here, or named by the caller with `claim_port`, is not given again by
this process while it is among the last 4,096 (a long-running spoke starts replicas for months;
the race lasts seconds).
"""

from __future__ import annotations

import socket
import threading

_REMEMBERED = 4096
_given: dict[int, None] = {}  # insertion-ordered: the oldest is forgotten first
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, and not one this process gave out lately."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    while True:  # the kernel's ephemeral range holds ~28,000 ports: a repeat is rare
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        with _lock:
            if port not in _given:
                _remember(port)
                return port


def claim_port(port: int) -> None:
    """`port` is taken by the caller (a port it was told to use): do not give it out."""
    with _lock:
        _remember(port)


def _remember(port: int) -> None:
    _given.pop(port, None)
    _given[port] = None
    if len(_given) > _REMEMBERED:
        del _given[next(iter(_given))]
