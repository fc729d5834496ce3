"""Serve a Prometheus registry over HTTP: shared by the spoke and the burst controller.

(The hub serves its metrics on its API port instead.) It lives beside the NATS client because
`bus` is the one package every service may import.
"""

from __future__ import annotations

import asyncio

import structlog
import uvicorn
from prometheus_client import CollectorRegistry, make_asgi_app

log = structlog.get_logger(__name__)


async def serve_metrics(
    registry: CollectorRegistry, host: str, port: int, stop: asyncio.Event
) -> None:
    """Serve `registry` at http://host:port/metrics until `stop` is set."""
    server = uvicorn.Server(
        uvicorn.Config(make_asgi_app(registry), host=host, port=port, log_level="warning")
    )
    task = asyncio.create_task(server.serve())
    log.info("metrics_serving", url=f"http://{host}:{port}/metrics")
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    waiter.cancel()
    await task
