"""What the session tests share: a tiny HTTP server as the session, the API served on a port."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import httpx

from tests.integration.fed import InProcessFederation
from tests.support.wait import wait_until

#: A tiny HTTP server on the address and port gpufed gives the workload.
SERVER = (
    "import http.server, os\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = ('hello from ' + os.environ['GPUFED_WORKLOAD_ID']).encode()\n"
    "        self.send_response(200); self.end_headers(); self.wfile.write(body)\n"
    "    def log_message(self, *args): pass\n"
    "addr = (os.environ['GPUFED_HOST'], int(os.environ['GPUFED_PORT']))\n"
    "http.server.HTTPServer(addr, H).serve_forever()\n"
)


def server_command(load_percent: float | None = None) -> list[str]:
    """The server as a command; with `load_percent`, it first reports that GPU load."""
    if load_percent is None:
        return [sys.executable, "-c", SERVER]
    script = f'echo {load_percent:g} > "$GPUFED_LOAD_FILE"; exec "$0" -c "$1"'
    return ["sh", "-c", script, sys.executable, SERVER]


def session(name: str, load_percent: float | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": "vision",
        "kind": "session",
        "gpu_fraction": 0.5,
        "command": server_command(load_percent),
        **extra,
    }


async def get_when_up(url: str, timeout: float = 15) -> httpx.Response:
    """GET `url` once something answers there."""
    answer: list[httpx.Response] = []

    async def answered() -> bool:
        try:
            async with httpx.AsyncClient() as client:
                answer.append(await client.get(url, timeout=2))
        except httpx.TransportError:
            return False
        return True

    await wait_until(answered, timeout, f"{url} to answer", every=0.1)
    return answer[-1]


async def gpufed(fed: InProcessFederation, api: str, *argv: str) -> tuple[int, str, str]:
    """Run the `gpufed` CLI as a user would, against `api` with the admin token."""
    env = {**os.environ, "GPUFED_API": api, "GPUFED_TOKEN": fed.admin_token}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpufed",
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


#: Spokes of these tests stop their workloads when they stop: a session serves for ever.
STOP_ON_EXIT = {"stop_workloads_on_exit": True}
