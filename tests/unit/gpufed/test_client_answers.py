"""A URL that is not gpufed's API (a /metrics port, a web server) gets a clear error from the
client, not a JSON decoding traceback."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufed.client import ApiError, HubClient


class _Metrics(BaseHTTPRequestHandler):
    """What a Prometheus /metrics endpoint answers, on any path."""

    def do_GET(self) -> None:
        body = b"# HELP up 1 when up\n# TYPE up gauge\nup 1\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def metrics_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_that_is_not_the_api_is_named(metrics_url: str) -> None:
    client = HubClient(metrics_url, token="t")
    try:
        with pytest.raises(ApiError, match="did not answer as gpufed's API does") as raised:
            client.health()
    finally:
        client.close()
    assert "/v1/health" in str(raised.value)
    assert "# HELP up" in str(raised.value)
    assert raised.value.status == 200
