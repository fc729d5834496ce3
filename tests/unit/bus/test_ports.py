"""Free ports: two asks in one process never get the same port, even when the kernel would
hand one out twice because nothing has bound it yet (`gpufed up` picks the hub's API port and
then the spokes' /metrics ports before the hub listens: a repeat put a spoke's /metrics on the
hub's port, and `gpufed up` read Prometheus text where it asked for its health)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from types import TracebackType

import pytest

from bus import ports


class _Kernel:
    """The kernel's picks for bind(("127.0.0.1", 0)), in order: repeats included."""

    def __init__(self, picks: list[int]) -> None:
        self.picks: Iterator[int] = iter(picks)

    def socket(self, *_args: object) -> _Socket:
        return _Socket(next(self.picks))


class _Socket:
    def __init__(self, port: int) -> None:
        self.port = port

    def bind(self, _address: tuple[str, int]) -> None:
        pass

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        pass


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch) -> _Kernel:
    monkeypatch.setattr(ports, "_given", {})
    fake = _Kernel([])
    monkeypatch.setattr(ports.socket, "socket", fake.socket)
    return fake


def test_a_port_the_kernel_hands_out_twice_is_given_once(kernel: _Kernel) -> None:
    kernel.picks = iter([40001, 40001, 40002])
    assert [ports.free_port(), ports.free_port()] == [40001, 40002]


def test_a_claimed_port_is_not_given(kernel: _Kernel) -> None:
    ports.claim_port(40001)  # `gpufed up --api-port 40001`: the hub binds it a moment later
    kernel.picks = iter([40001, 40003])
    assert ports.free_port() == 40003


def test_only_the_latest_ports_are_remembered(kernel: _Kernel) -> None:
    kernel.picks = iter(range(30000, 30000 + ports._REMEMBERED + 1))
    for _ in range(ports._REMEMBERED + 1):
        ports.free_port()
    assert len(ports._given) == ports._REMEMBERED
    kernel.picks = iter([30000])  # given out 4,097 ports ago: long bound or long gone
    assert ports.free_port() == 30000


def test_real_ports_are_distinct_and_bindable() -> None:
    given = [ports.free_port() for _ in range(50)]
    assert len(set(given)) == 50
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", given[-1]))
