"""Watch the instance metadata for a spot interruption notice (EC2: two minutes' warning).

EC2 announces the end of a spot instance at `/latest/meta-data/spot/instance-action` (404 until
then, then `{"action": "terminate" | "stop" | "hibernate", "time": "<UTC ISO 8601>"}`). The
watcher asks IMDSv2 for a session token, polls that path, and calls `on_notice` once, with the
notice, when it appears. Errors are logged and polled again: a metadata service that does not
answer must not stop the spoke.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime

import httpx
import structlog

from bus.tasks import pause

log = structlog.get_logger(__name__)

#: The link-local address of the instance metadata service on EC2.
IMDS_URL = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
NOTICE_PATH = "/latest/meta-data/spot/instance-action"
TOKEN_TTL_S = 21600


@dataclass(frozen=True, slots=True)
class InterruptionNotice:
    action: str  # terminate, stop or hibernate
    at: float  # when the instance goes, seconds since the epoch


async def watch_interruption(
    on_notice: Callable[[InterruptionNotice], Awaitable[None]],
    stop: asyncio.Event,
    *,
    base_url: str = IMDS_URL,
    poll_s: float = 5.0,
) -> None:
    """Poll until a notice appears (then call `on_notice` and return) or `stop` is set."""
    token = ""
    async with httpx.AsyncClient(base_url=base_url, timeout=2.0) as client:
        while not stop.is_set():
            try:
                if not token:
                    token = await _token(client)
                notice = await _notice(client, token)
                if notice is not None:
                    log.warning("interruption_notice", action=notice.action, at=notice.at)
                    await on_notice(notice)
                    return
            except _TokenExpired:
                token = ""
                continue
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("imds_poll_failed", error=str(exc) or type(exc).__name__)
            await pause(stop, poll_s)


class _TokenExpired(Exception):
    pass


async def _token(client: httpx.AsyncClient) -> str:
    response = await client.put(
        TOKEN_PATH, headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)}
    )
    response.raise_for_status()
    return response.text.strip()


async def _notice(client: httpx.AsyncClient, token: str) -> InterruptionNotice | None:
    response = await client.get(NOTICE_PATH, headers={"X-aws-ec2-metadata-token": token})
    if response.status_code == 404:
        return None
    if response.status_code == 401:
        raise _TokenExpired
    response.raise_for_status()
    body = response.json()
    when = datetime.fromisoformat(str(body["time"]).replace("Z", "+00:00"))
    return InterruptionNotice(action=str(body["action"]), at=when.timestamp())
