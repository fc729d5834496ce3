"""A team's replica serves pages on the hub's own origin (`/svc/<team>/<service>/`), where the
console keeps the caller's API token: in Debian's Chromium, a script such a page carries must
not reach that token (the gateway's sandbox gives the page an origin of its own)."""

from __future__ import annotations

import sys
from typing import Any

from tests.browser.conftest import LiveHub
from tests.browser.test_console import log_in
from tests.integration.fed import nodes
from tests.support.wait import wait_until as until

#: A replica whose every page tries to read the console's token from the page's origin.
THIEF = (
    "import http.server, os\n"
    "PAGE = b'''<html><body><p id=out>?</p><script>\n"
    "let r; try { r = 'token:' + localStorage.getItem('gpufed.token'); }\n"
    "catch (e) { r = 'blocked:' + e.name; }\n"
    "document.getElementById('out').textContent = r;\n"
    "</script></body></html>'''\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        self.send_response(200); self.send_header('Content-Type', 'text/html')\n"
    "        self.end_headers(); self.wfile.write(PAGE)\n"
    "    def log_message(self, *args): pass\n"
    "addr = (os.environ['GPUFED_HOST'], int(os.environ['GPUFED_PORT']))\n"
    "http.server.HTTPServer(addr, H).serve_forever()\n"
)


async def test_a_replicas_page_cannot_read_the_consoles_token(
    live_hub: LiveHub, browser_context: Any
) -> None:
    fed = live_hub.fed
    await live_hub.start()
    await fed.start_spoke("eu-1", "eu", nodes("eu-1", 1, 1, "L4"))
    await fed.wait_spokes(1)
    assert fed.api is not None
    spec = {
        "name": "page",
        "team": "nlp",
        "public": True,  # anyone's browser may open it: no token needed
        "replica": {"command": [sys.executable, "-c", THIEF], "gpu_fraction": 0.25},
        "health": {"path": "/health", "period_s": 0.2, "startup_s": 30},
    }
    made = await fed.api.post("/v1/services", json=spec)
    assert made.status_code == 201, made.text

    async def ready() -> bool:
        status = (await fed.api.get("/v1/services/nlp/page")).json()
        return bool(status["ready"] >= 1)

    await until(ready, timeout=60, what="a ready replica")

    page = await browser_context.new_page()
    await page.goto(live_hub.url + "/")
    await log_in(page, fed.admin_token)  # an admin's token, kept on the hub's origin
    await page.goto(live_hub.url + "/svc/nlp/page/")
    await page.wait_for_selector("#out:not(:has-text('?'))")
    seen = await page.inner_text("#out")
    assert seen == "blocked:SecurityError"
    assert fed.admin_token not in await page.content()
