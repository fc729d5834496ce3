"""ASGI middleware that bounds request bodies before anything parses them.

- A body over `max_body` bytes is answered 413 at once: from `Content-Length` when the client
  sends one, else while the chunks stream in (the rest is never read).
- Every body is read as JSON, whatever its Content-Type says.
- A JSON body nested deeper than `max_depth` is answered 422 before `json.loads` can recurse
  (deep nesting costs the parser stack and ends in a RecursionError otherwise).

The body is buffered (at most `max_body` bytes) and replayed to the application unchanged.
Paths under an `exempt` prefix pass untouched: the gateway's bodies (`/svc/...`) belong to the
service they go to (any type, any size), and are relayed to it as they come.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

MAX_BODY_BYTES = 1024 * 1024
MAX_JSON_DEPTH = 32

_OPEN = frozenset(b"[{")
_CLOSE = frozenset(b"]}")


class BodyLimits:
    """Wraps an ASGI app: 413 for big bodies, 422 for JSON nested too deep."""

    def __init__(
        self,
        app: App,
        max_body: int = MAX_BODY_BYTES,
        max_depth: int = MAX_JSON_DEPTH,
        exempt: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.max_depth = max_depth
        self.exempt = exempt

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") in ("GET", "HEAD", "OPTIONS")
            or str(scope.get("path", "")).startswith(self.exempt)
        ):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            await _reply(send, 413, "body_too_large", self._too_large())
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await _reply(send, 413, "body_too_large", self._too_large())
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        brackets = body.count(b"[") + body.count(b"{")
        if brackets > self.max_depth and json_depth(body) > self.max_depth:
            await _reply(send, 422, "too_deep", f"JSON nested deeper than {self.max_depth} levels")
            return
        # The API speaks JSON only: a body sent as a form (`curl -d`) or without a type is read
        # as the JSON it is meant to be, as before the routes were typed.
        headers = [(k, v) for k, v in scope.get("headers", ()) if k != b"content-type"]
        scope = {**scope, "headers": [*headers, (b"content-type", b"application/json")]}
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _too_large(self) -> str:
        return f"request body larger than {self.max_body} bytes"


def json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in `body` (strings skipped); 0 for scalars."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in _OPEN:
            depth += 1
            deepest = max(deepest, depth)
        elif byte in _CLOSE:
            depth -= 1
    return deepest


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _reply(send: Send, status: int, code: str, message: str) -> None:
    error = {"code": code, "message": message, "field": None, "retryable": False}
    body = json.dumps(error).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
