"""The demo's interactive and serving part: a notebook session and an inference service that
scales up under load and back down, among the demo's jobs (`gpufed up --demo`)."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from gpufed.client import ApiError, HubClient

TEAM, SERVICE = "nlp", "chat"
#: The load generator: at most this many requests, this many at a time.
LOAD_REQUESTS, LOAD_CONCURRENCY = 3000, 6
SCALE_TIMEOUT_S = 60.0

NOTEBOOK: dict[str, Any] = {
    "name": "notebook-carol",
    "team": "research",
    "kind": "session",
    "gpu_fraction": 0.5,
    "gpu_models": ["L4"],
    # A stand-in for a notebook server: it serves on the address and port gpufed gives it.
    "command": [
        "sh",
        "-c",
        f'exec {sys.executable} -m http.server --bind "$GPUFED_HOST" "$GPUFED_PORT"',
    ],
    "max_runtime_s": 600,
}

CHAT: dict[str, Any] = {
    "name": SERVICE,
    "team": TEAM,
    "priority_class": "production",
    "replica": {
        "command": [sys.executable, "-m", "gpufed.replica"],
        "env": {"REPLICA_DELAY_S": "0.05"},
        "gpu_fraction": 0.25,
        "gpu_models": ["L4"],
    },
    "min_replicas": 1,
    "max_replicas": 3,
    "health": {"path": "/health", "period_s": 0.5},
    "autoscaling": {"target": 4, "window_s": 3, "scale_down_delay_s": 3},
}


class ServingDemo:
    """Opens the notebook and starts the service, drives load, reports; `ok` says it all."""

    def __init__(self, client: HubClient, api_url: str, token: str | None) -> None:
        self.client = client
        self.api_url = api_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.notebook_id = ""
        self.notebook_ok = False
        self.peak = 0
        self.scaled_down = False
        self.answered = 0

    def start(self) -> None:
        """Open the notebook session and create the service (before the jobs arrive)."""
        self.notebook_id = self.client.submit(NOTEBOOK)["id"]
        made = self.client.create_service(CHAT)
        print(f"session {NOTEBOOK['name']} opened ({self.notebook_id}); service "
              f"{TEAM}/{SERVICE} created: {CHAT['min_replicas']}..{CHAT['max_replicas']} "
              f"replicas, production, at {made['url']}")  # fmt: skip

    def check_notebook(self, timeout_s: float = 30.0) -> None:
        """Wait for the session's URL and GET it, as a data scientist's browser would."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            record = self.client.workload(self.notebook_id)
            url = record.get("endpoint")
            if url:
                try:
                    answer = httpx.get(url, timeout=2, trust_env=False)
                except httpx.TransportError:
                    time.sleep(0.2)
                    continue
                self.notebook_ok = answer.status_code == 200
                print(f"session {NOTEBOOK['name']}: {url} answered {answer.status_code}")
                return
            time.sleep(0.2)
        print(f"session {NOTEBOOK['name']}: no URL within {timeout_s:g} s")

    def drive_load(self) -> None:
        """Send up to LOAD_REQUESTS through the gateway until the service runs its maximum."""
        stop = threading.Event()
        url = f"{self.api_url}/svc/{TEAM}/{SERVICE}/generate"
        sent = [0]
        lock = threading.Lock()

        def worker() -> None:
            with httpx.Client(headers=self.headers, timeout=60, trust_env=False) as http:
                while not stop.is_set():
                    with lock:
                        if sent[0] >= LOAD_REQUESTS:
                            return
                        sent[0] += 1
                    if http.get(url).status_code == 200:
                        with lock:
                            self.answered += 1

        print(f"load: up to {LOAD_REQUESTS} requests, {LOAD_CONCURRENCY} at a time ...")
        with ThreadPoolExecutor(LOAD_CONCURRENCY) as pool:
            futures = [pool.submit(worker) for _ in range(LOAD_CONCURRENCY)]
            deadline = time.monotonic() + SCALE_TIMEOUT_S
            while not all(f.done() for f in futures) and time.monotonic() < deadline:
                self._status_line()
                if self.peak >= CHAT["max_replicas"]:
                    break
                time.sleep(0.5)
            stop.set()
        print(f"load: stopped after {sent[0]} requests ({self.answered} answered)")

    def watch_scale_down(self) -> None:
        """Wait for the service to drop back to its minimum once the load is gone."""
        deadline = time.monotonic() + SCALE_TIMEOUT_S
        while time.monotonic() < deadline:
            status = self.client.service(TEAM, SERVICE)
            if len(status["replicas"]) <= CHAT["min_replicas"]:
                self.scaled_down = True
                self._status_line(status)
                return
            time.sleep(0.5)

    def finish(self) -> bool:
        """Print the service's figures, close the session, delete the service; all went well?"""
        status = self.client.service(TEAM, SERVICE)
        cost = status["cost_per_1k_requests"]
        print(
            f"service {TEAM}/{SERVICE}: peaked at {self.peak} ready replicas, back to "
            f"{len(status['replicas'])}; {status['requests']} requests, "
            f"{status['gpu_seconds']:.1f} GPU-s, ${status['cost_dollars']:.4f} -> "
            f"{'-' if cost is None else f'${cost:.4f}'} per 1,000 requests"
        )
        try:
            self.client.cancel(self.notebook_id)
            self.client.delete_service(TEAM, SERVICE)
        except ApiError as exc:
            print(f"closing the session and the service: {exc}")
        print()
        return self.notebook_ok and self.peak >= 2 and self.scaled_down

    def _status_line(self, status: dict[str, Any] | None = None) -> dict[str, Any]:
        status = status or self.client.service(TEAM, SERVICE)
        self.peak = max(self.peak, status["ready"])
        print(
            f"  service {TEAM}/{SERVICE}: {len(status['replicas'])} replicas "
            f"({status['ready']} ready), {status['rps']:.1f} req/s, "
            f"{status['requests']} served [{status['reason']}]",
            flush=True,
        )
        return status
