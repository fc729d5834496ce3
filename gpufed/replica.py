"""A tiny inference-service replica for the demo and the tests: `python -m gpufed.replica`.

Listens on $GPUFED_HOST:$GPUFED_PORT (set by the runtime for kind `service`). Every GET
answers `<$REPLICA_VERSION> <workload id>` after $REPLICA_DELAY_S seconds (a stand-in for
inference time); `/health` answers 200 until someone calls `/sick`, then 500; `/exit` ends
the process with status 3 (a crash). `/stream` answers like a language model streaming
tokens (server-sent events, no length): its first event at once, the rest once someone has
called `/release` since (at most 30 s later), so a test can tell a streamed answer from one
buffered whole on the way. A POST's body (with a length, or in chunks) is read as it comes
and its size and Content-Type answered; `/received` answers how many bytes of the POST being
read have arrived so far, so a test can tell an upload relayed as it comes from one gathered
whole first.
"""

from __future__ import annotations

import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_sick = threading.Event()
_released = threading.Event()
_received = [0]  # bytes of the POST body being read that have arrived
_PIECE = 64 * 1024


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/health"):
            self._answer(500 if _sick.is_set() else 200, b"sick" if _sick.is_set() else b"ok")
            return
        if self.path.startswith("/sick"):
            _sick.set()
            self._answer(200, b"now sick")
            return
        if self.path.startswith("/exit"):
            self._answer(200, b"bye")
            os._exit(3)
        if self.path.startswith("/release"):
            _released.set()
            self._answer(200, b"released")
            return
        if self.path.startswith("/stream"):
            self._stream()
            return
        if self.path.startswith("/received"):
            self._answer(200, str(_received[0]).encode())
            return
        time.sleep(float(os.environ.get("REPLICA_DELAY_S", "0")))
        version = os.environ.get("REPLICA_VERSION", "v1")
        self._answer(200, f"{version} {os.environ.get('GPUFED_WORKLOAD_ID', '?')}".encode())

    def do_POST(self) -> None:
        _received[0] = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().split(b";")[0], 16):
                self._take(size)
                self.rfile.readline()  # the chunk's CRLF
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
        else:
            self._take(int(self.headers.get("Content-Length", "0")))
        kind = self.headers.get("Content-Type", "")
        self._answer(200, f"{_received[0]} {kind}".strip().encode())

    def _take(self, size: int) -> None:
        while size > 0:
            piece = self.rfile.read(min(size, _PIECE))
            if not piece:
                raise ConnectionError("the body ended early")
            _received[0] += len(piece)
            size -= len(piece)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()  # no length: the answer ends when the connection closes (HTTP/1.0)
        self.wfile.write(b"data: token 1\n\n")
        _released.wait(30)
        _released.clear()  # the next stream waits for the next /release
        self.wfile.write(b"data: token 2\n\ndata: [DONE]\n\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    address = (os.environ.get("GPUFED_HOST", "127.0.0.1"), int(os.environ["GPUFED_PORT"]))
    ThreadingHTTPServer(address, _Handler).serve_forever()


if __name__ == "__main__":
    main()
