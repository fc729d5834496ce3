"""Property-based fuzzing of a real hub: its REST API from /openapi.json, its NATS subjects.

Used by `tests/integration/security/test_fuzz.py` (a bounded number of cases in `make test`) and by
`bench/fuzz.py` (thousands). The hub runs as its own process over a real nats-server (no
spokes: nothing fuzzed is ever executed), so a crash is a dead process, not a test exception.

- REST: schemathesis generates valid and invalid requests for every operation of the hub's
  own OpenAPI document; each goes with the admin token, a member's token, or none. A 5xx is a
  server error; no answer within the timeout is a hang; a refused connection is a crash.
- NATS: every subject the hub handles gets random bytes, random JSON, and mutated valid
  messages of the subject's model. Request/reply subjects must answer; afterwards the hub must
  still be healthy, its durable consumers must have nothing left unacknowledged, and
  /v1/health must answer.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

from bus.client import Bus
from gpufed.up import Federation
from schemas import subjects
from schemas.burst import BURST_INSTANCES, BURST_STATE

T = TypeVar("T")
TIMEOUT_S = 10.0


@dataclass
class Findings:
    api_cases: int = 0
    nats_cases: int = 0
    server_errors: int = 0
    crashes: int = 0
    hangs: int = 0
    examples: list[str] = field(default_factory=list)

    def note(self, kind: str, what: str) -> None:
        setattr(self, kind, getattr(self, kind) + 1)
        if len(self.examples) < 10:
            self.examples.append(f"{kind}: {what[:300]}")

    def summary(self) -> dict[str, int]:
        return {
            "api_cases": self.api_cases,
            "nats_cases": self.nats_cases,
            "server_errors": self.server_errors,
            "crashes": self.crashes,
            "hangs": self.hangs,
        }


def fuzz_hub(root: Path, api_cases: int, nats_cases: int, seed: int = 0) -> Findings:
    """Start NATS and a hub under `root`, fuzz them, stop them; what was found."""
    fed = Federation(root, 0, fleet=())
    findings = Findings()
    fed.start(timeout_s=60)
    try:
        member = _member_token(fed)
        _fuzz_api(fed, member, api_cases, seed, findings)
        _fuzz_nats(fed, nats_cases, seed, findings)
        _check_alive(fed, findings)
    finally:
        fed.stop()
    return findings


# --- REST ---


def _member_token(fed: Federation) -> str:
    client = fed.client()
    try:
        return str(client.create_token("fuzz", "member", "vision")["token"])
    finally:
        client.close()


def _fuzz_api(fed: Federation, member: str, cases: int, seed: int, found: Findings) -> None:
    document = httpx.get(f"{fed.api_url}/openapi.json", timeout=TIMEOUT_S).json()
    schema = schemathesis.openapi.from_dict(document)
    strategies = []
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            strategies.append(operation.as_strategy(generation_mode=mode))
    tokens = [fed.admin_token, member, None, "gpufed_000000000000_forged"]
    session = requests.Session()

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=False,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=st.one_of(strategies), token=st.sampled_from(tokens))
    def run(case: Any, token: str | None) -> None:
        found.api_cases += 1
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            response = case.call(
                base_url=fed.api_url, session=session, headers=headers, timeout=TIMEOUT_S
            )
        except requests.Timeout:
            found.note("hangs", f"{case.method} {case.formatted_path}")
            return
        except requests.ConnectionError as exc:
            found.note("crashes", f"{case.method} {case.formatted_path}: {exc}")
            return
        if response.status_code >= 500:
            found.note(
                "server_errors",
                f"{case.method} {case.formatted_path} -> {response.status_code} {response.text}",
            )

    _seeded(run, seed)()
    session.close()


# --- NATS ---

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=40),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)
_IDS = st.sampled_from(["eu-1", "eu-2", "w1", "", "x" * 70, "a.b", "*", ">", "\x00"])
_VALUES = _JSON | _IDS | st.integers(min_value=-(2**70), max_value=2**70)


def _samples() -> dict[str, dict[str, Any]]:
    now = time.time()
    return {
        "submit": {"name": "fz", "team": "vision", "command": ["true"]},
        "capacity": {
            "spoke_id": "eu-1",
            "region": "eu",
            "kind": "onprem",
            "incarnation": "i1",
            "seq": 1,
            "sent_at": now,
            "nodes": [{"name": "n1", "gpu_model": "H100", "gpu_count": 8, "free_devices": [0]}],
            "running": [],
        },
        "sync": {
            "spoke_id": "eu-1",
            "incarnation": "i1",
            "running": [],
            "finished": [],
            "applied_seq": 0,
        },
        "event": {
            "event_id": "e1",
            "spoke_id": "eu-1",
            "workload_id": "w1",
            "epoch": 1,
            "phase": "succeeded",
            "at": now,
        },
        "instance": {
            "burst_id": "burst-fz-1",
            "provider": "local",
            "instance_type": "p5.48xlarge",
            "region": "us-east-1",
            "market": "spot",
            "price_per_hour": 1.0,
            "team": "vision",
            "state": "requested",
            "at": now,
        },
        "burst_state": {"provider": "local"},
    }


@st.composite
def _payload(draw: st.DrawFn, sample: dict[str, Any]) -> bytes:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(st.binary(max_size=300))
    if kind == 1:
        return json.dumps(draw(_JSON), allow_nan=True).encode()
    message = dict(sample)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([*sample, "extra"]))
        message[key] = draw(_VALUES)
    return json.dumps(message, allow_nan=True).encode()


def _fuzz_nats(fed: Federation, cases: int, seed: int, found: Findings) -> None:
    samples = _samples()
    spoke = st.sampled_from(["eu-1", "eu-2", "zz-9"])
    targets = st.one_of(
        st.tuples(st.just("request"), st.just(subjects.SUBMIT), _payload(samples["submit"])),
        st.tuples(
            st.just("publish"),
            spoke.map(subjects.capacity),
            _payload(samples["capacity"]),
        ),
        st.tuples(st.just("request"), spoke.map(subjects.sync), _payload(samples["sync"])),
        st.tuples(st.just("durable"), spoke.map(subjects.events), _payload(samples["event"])),
        st.tuples(st.just("durable"), st.just(BURST_INSTANCES), _payload(samples["instance"])),
        st.tuples(st.just("request"), st.just(BURST_STATE), _payload(samples["burst_state"])),
    )
    with _Loop() as loop:
        bus = Bus(fed.client_settings("fuzz"))
        loop.run(bus.connect())
        counter = iter(range(10**9))

        @settings(
            max_examples=cases,
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(target=targets)
        def run(target: tuple[str, str, bytes]) -> None:
            how, subject, payload = target
            found.nats_cases += 1
            try:
                if how == "request":
                    loop.run(bus.nc.request(subject, payload, timeout=TIMEOUT_S))
                elif how == "durable":
                    loop.run(bus.publish_durable(subject, payload, f"fz-{next(counter)}"))
                else:
                    loop.run(bus.publish(subject, payload))
            except TimeoutError:
                found.note("hangs", f"{subject}: {payload[:100]!r}")

        try:
            _seeded(run, seed)()
            loop.run(bus.nc.flush())
            _wait_acked(loop, bus, found)
        finally:
            loop.run(bus.close())


def _wait_acked(loop: _Loop, bus: Bus, found: Findings) -> None:
    """Every fuzzed durable message must be acknowledged by the hub (none wedged)."""
    for stream, consumer in (
        (subjects.EVENTS_STREAM, subjects.HUB_EVENTS_CONSUMER),
        ("GPUFED_BURST", "hub-burst"),
    ):
        deadline = time.monotonic() + 30
        while True:
            info = loop.run(bus.js.consumer_info(stream, consumer))
            if info.num_ack_pending == 0 and info.num_pending == 0:
                break
            if time.monotonic() > deadline:
                found.note("hangs", f"{consumer}: {info.num_pending} pending")
                break
            time.sleep(0.1)


def _check_alive(fed: Federation, found: Findings) -> None:
    hub = fed.procs.get("hub")
    if hub is None or hub.poll() is not None:
        found.note("crashes", "the hub process exited")
        return
    try:
        health = httpx.get(f"{fed.api_url}/v1/health", timeout=TIMEOUT_S).json()
    except httpx.HTTPError as exc:
        found.note("crashes", f"health: {exc}")
        return
    if not health["ok"]:
        found.note("crashes", f"hub not ready after fuzzing: {health}")


def _seeded(test: Callable[[], None], seed: int) -> Callable[[], None]:
    from hypothesis import seed as hypothesis_seed

    return hypothesis_seed(seed)(test) if seed else test


class _Loop:
    """An event loop in a thread, so Hypothesis' synchronous tests can drive async clients."""

    def __enter__(self) -> _Loop:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        return self

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(TIMEOUT_S * 2)

    def __exit__(self, *_exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()
