"""The list/watch threads that feed changes of one spoke's Jobs and pods to the event loop.

One thread per resource (Jobs, Pods): list, then watch from the list's resourceVersion, relist on
410 Gone, retry other failures with backoff. Each change is handed to an async callback on the
event loop, and the thread waits until it is handled (back-pressure); a fresh list arrives as one
"RELISTED" change whose object is the whole list.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread
import structlog
from kubernetes import client as k8s

from spoke.kube import DEFAULT_TIMEOUT_S, meta

log = structlog.get_logger(__name__)

WATCH_SERVER_TIMEOUT_S = 300
WATCH_READ_TIMEOUT_S = 330.0
_RETRY_MIN_S = 0.5
_RETRY_MAX_S = 30.0
_JOIN_S = 2.0

#: Handles one change: kind ("jobs" or "pods"), event type (ADDED, MODIFIED, DELETED or
#: RELISTED) and the object (for RELISTED, the whole list).
OnChange = Callable[[str, str, Mapping[str, Any]], Coroutine[Any, Any, None]]


class Watcher:
    """Watch threads for the Jobs and pods that match `selector`, reporting to `on_change`."""

    def __init__(
        self,
        batch: k8s.BatchV1Api,
        core: k8s.CoreV1Api,
        selector: str,
        on_change: OnChange,
    ) -> None:
        self._batch = batch
        self._core = core
        self._selector = selector
        self._on_change = on_change
        self._threads: list[threading.Thread] = []
        self._responses: dict[str, Any] = {}
        self._responses_lock = threading.Lock()
        self._closing = threading.Event()
        self._token: anyio.lowlevel.EventLoopToken | None = None

    def prepare(self) -> None:
        """Remember the running event loop, which the threads report to; call it from there."""
        if self._token is None:
            self._token = anyio.lowlevel.current_token()

    def ensure_running(self) -> None:
        """Start the threads, unless they run or close() was called; returns at once."""
        if self._threads or self._closing.is_set():
            return
        for kind in ("jobs", "pods"):
            thread = threading.Thread(
                target=self._watch_forever, args=(kind,), name=f"gpufed-watch-{kind}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    async def close(self) -> None:
        """Stop the threads: no change is reported once this is called. Waits a little for each."""
        self._closing.set()
        with self._responses_lock:
            responses = list(self._responses.values())
        for response in responses:
            _shutdown(response)
        for thread in self._threads:
            await anyio.to_thread.run_sync(thread.join, _JOIN_S)
            if thread.is_alive():
                # Still waiting for a watch's response headers: it ends at the read timeout (or
                # when the connection drops) and reports nothing after `_closing` is set.
                log.info("kubernetes_watch_detached", thread=thread.name)
        self._threads.clear()

    def _watch_forever(self, kind: str) -> None:
        """List, then watch from the list's version; relist on 410 Gone; retry with backoff."""
        lister: Callable[..., Any] = (
            self._batch.list_job_for_all_namespaces
            if kind == "jobs"
            else self._core.list_pod_for_all_namespaces
        )
        version: str | None = None
        delay = _RETRY_MIN_S
        while not self._closing.is_set():
            try:
                if version is None:
                    response = lister(
                        label_selector=self._selector,
                        _preload_content=False,
                        _request_timeout=DEFAULT_TIMEOUT_S,
                    )
                    try:
                        listing = json.loads(response.data)
                    finally:
                        response.release_conn()
                    version = str(meta(listing).get("resourceVersion") or "")
                    if not self._deliver(kind, "RELISTED", listing):
                        return
                version = self._stream(kind, lister, version)
                delay = _RETRY_MIN_S
            except Exception as exc:
                if self._closing.is_set():
                    return
                if getattr(exc, "status", None) == 410:
                    version = None
                    continue
                log.warning("kubernetes_watch_failed", kind=kind, error=str(exc)[:300])
                self._closing.wait(delay)
                delay = min(delay * 2, _RETRY_MAX_S)

    def _stream(self, kind: str, lister: Any, version: str) -> str | None:
        """Follow one watch request; returns the last version, or None to ask for a relist."""
        response = lister(
            label_selector=self._selector,
            watch=True,
            resource_version=version or None,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SERVER_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=(DEFAULT_TIMEOUT_S, WATCH_READ_TIMEOUT_S),
        )
        with self._responses_lock:
            self._responses[kind] = response
        try:
            # close() sets the flag, then shuts down the responses it finds: checking after
            # registering means one of the two always stops this stream.
            if self._closing.is_set():
                return version
            for line in _lines(response):
                if self._closing.is_set():
                    return version
                event = json.loads(line)
                kind_of_event = event.get("type")
                obj = event.get("object") or {}
                if kind_of_event == "ERROR":
                    if obj.get("code") == 410:
                        log.info("kubernetes_watch_expired", kind=kind)
                        return None
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = str(meta(obj).get("resourceVersion") or version)
                if kind_of_event in ("ADDED", "MODIFIED", "DELETED") and not self._deliver(
                    kind, kind_of_event, obj
                ):
                    return version
            return version
        finally:
            with self._responses_lock:
                self._responses.pop(kind, None)
            response.close()  # closes the socket: the server ends the watch now
            response.release_conn()

    def _deliver(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> bool:
        """Hand one change to the event loop and wait until it is handled (back-pressure)."""
        if self._closing.is_set():
            return False
        try:
            anyio.from_thread.run(self._on_change, kind, event_type, obj, token=self._token)
        except Exception as exc:  # the loop is gone: nobody to report to any more
            log.debug("kubernetes_watch_detached", kind=kind, error=str(exc))
            self._closing.set()
            return False
        return True


def _lines(response: Any) -> Iterator[str]:
    """Newline-delimited JSON lines of a streaming response, as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk if isinstance(chunk, bytes) else str(chunk).encode()
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if line.strip():
                yield line.decode("utf-8", errors="replace")
    if buffer.strip():
        yield buffer.decode("utf-8", errors="replace")


def _shutdown(response: Any) -> None:
    """Unblock a thread reading a watch response (urllib3 2.3+; older: the raw socket)."""
    try:
        response.shutdown()
        return
    except Exception:
        pass
    try:
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            import socket

            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
