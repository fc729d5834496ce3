"""A hub or spoke started before its NATS server (or pointed at a wrong URL) retries its first
connect; told to stop meanwhile (SIGTERM from a service manager, Ctrl-C), it exits at once
rather than retrying until SIGKILL. A spoke that reached NATS but waits for the hub's command
stream stops as quietly. (`gpufed burst`: tests/integration/burst.)"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from bus.natsserver import EmbeddedNats
from bus.ports import free_port


def _argv(piece: str, url: str, tmp_path: Path) -> list[str]:
    if piece == "hub":
        data = str(tmp_path / "hub")
        return ["hub", "--nats-url", url, "--data-dir", data, "--api-port", str(free_port())]
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes:\n  - {name: n0, gpu_model: H100, gpu_count: 2}\n")
    state = str(tmp_path / "spokes")
    spoke = ["spoke", "--id", "s1", "--region", "eu", "--nats-url", url]
    return [*spoke, "--inventory", f"static:{inventory}", "--state-dir", state]


@pytest.mark.parametrize("piece", ["hub", "spoke"])
def test_sigterm_stops_it_while_nats_is_unreachable(piece: str, tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(30)  # a guard: it dials within moments
        url = f"nats://127.0.0.1:{server.getsockname()[1]}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufed", *_argv(piece, url, tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            conn, _ = server.accept()  # its first connect attempt: no NATS server there
            conn.close()
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:  # only if the test failed
                proc.kill()
                proc.communicate()


def test_sigterm_stops_a_spoke_waiting_for_the_hubs_stream(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats") as nats:  # no hub: no command stream yet
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpufed", *_argv("spoke", nats.url, tmp_path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # it logs each time it finds no stream
                if "waiting_for_stream" in line:
                    break
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
            assert proc.returncode == 0 and "Traceback" not in err, err
        finally:
            if proc.poll() is None:  # only if the test failed
                proc.kill()
                proc.communicate()
