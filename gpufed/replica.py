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
whole first. `/ws` is a WebSocket: it answers each text message `echo <text>` and each binary
one as it came; on `bye` it closes the session as agreed, on `break` it drops the connection.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_sick = threading.Event()
_released = threading.Event()
_received = [0]  # bytes of the POST body being read that have arrived
_PIECE = 64 * 1024
_WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 1.3
_CLOSE, _PING, _PONG = 8, 9, 10


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
        if self.path.startswith("/ws") and self.headers.get("Upgrade", "").lower() == "websocket":
            self._websocket()
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

    def _websocket(self) -> None:
        key = self.headers.get("Sec-WebSocket-Key", "") + _WS_GUID
        self.protocol_version = "HTTP/1.1"  # an upgrade is HTTP/1.1's
        self.close_connection = True  # no request after the session
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        accept = base64.b64encode(hashlib.sha1(key.encode()).digest()).decode()
        self.send_header("Sec-WebSocket-Accept", accept)
        asked = self.headers.get("Sec-WebSocket-Protocol")
        if asked:
            self.send_header("Sec-WebSocket-Protocol", asked.split(",")[0].strip())
        self.end_headers()
        while True:
            opcode, payload = self._frame()
            if opcode == _CLOSE:
                self._send(_CLOSE, payload[:2])
                return
            if opcode == _PING:
                self._send(_PONG, payload)
            elif opcode == 1 and payload == b"bye":
                self._send(_CLOSE, (1000).to_bytes(2, "big"))
                while self._frame()[0] != _CLOSE:  # the caller's answering close
                    pass
                return
            elif opcode == 1 and payload == b"break":
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            elif opcode == 1:
                self._send(1, b"echo " + payload)
            elif opcode == 2:
                self._send(2, payload)

    def _frame(self) -> tuple[int, bytes]:
        """One frame from the caller (unfragmented: what clients send for small messages)."""
        head = self.rfile.read(2)
        if len(head) < 2:
            return _CLOSE, b""
        size = head[1] & 0x7F
        if size >= 126:
            size = int.from_bytes(self.rfile.read(2 if size == 126 else 8), "big")
        mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
        data = self.rfile.read(size)
        return head[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(data))

    def _send(self, opcode: int, data: bytes) -> None:
        size = len(data)
        if size < 126:
            head = bytes([0x80 | opcode, size])
        elif size < 1 << 16:
            head = bytes([0x80 | opcode, 126]) + size.to_bytes(2, "big")
        else:
            head = bytes([0x80 | opcode, 127]) + size.to_bytes(8, "big")
        self.wfile.write(head + data)

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
