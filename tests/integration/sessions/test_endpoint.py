"""A session listens on $GPUFED_PORT and is reached through the URL its spoke reports."""

from __future__ import annotations

import sys
from typing import Any

import httpx

from schemas import Phase
from tests.integration.fed import InProcessFederation, nodes
from tests.support.wait import wait_until

#: A tiny HTTP server on the port and address gpufed gives the workload.
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


def session(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "team": "vision",
        "kind": "session",
        "gpu_fraction": 0.5,
        "command": [sys.executable, "-c", SERVER],
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


async def test_a_session_is_reached_at_the_url_its_spoke_reports(
    fed: InProcessFederation,
) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 2, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(**session("notebook"))
    record = await fed.wait_phase(wid, {Phase.RUNNING})
    assert record["spec"]["priority_class"] == "dev"  # a session's class unless it names one
    url = record["endpoint"]
    assert url and url.startswith("http://127.0.0.1:")
    response = await get_when_up(url)
    assert response.status_code == 200
    assert response.text == f"hello from {wid}"

    assert fed.api is not None
    listed = (await fed.api.get("/v1/workloads")).json()
    assert [w["endpoint"] for w in listed if w["id"] == wid] == [url]

    await fed.api.delete(f"/v1/workloads/{wid}")
    ended = await fed.wait_phase(wid, {Phase.CANCELLED})
    assert ended["endpoint"] is None  # an ended session has no URL


async def test_a_job_gets_no_port_and_no_url(fed: InProcessFederation) -> None:
    await fed.start_hub()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "H100"))
    await fed.wait_spokes(1)
    wid = await fed.submit(
        name="plain",
        team="vision",
        command=["sh", "-c", 'test -z "$GPUFED_PORT" && sleep 30'],
    )
    record = await fed.wait_phase(wid, {Phase.RUNNING})
    assert record["spec"]["priority_class"] == "batch"
    assert record["endpoint"] is None
