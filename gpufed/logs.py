"""structlog set-up: console lines on a terminal, JSON lines elsewhere."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

import structlog


def configure(
    stream: TextIO | None = None, *, json: bool | None = None, level: str | None = None
) -> None:
    """Configure structlog once per process (level from GPUFED_LOG_LEVEL, default info)."""
    stream = stream or sys.stderr
    level_name = (level or os.environ.get("GPUFED_LOG_LEVEL", "info")).upper()
    if json is None:
        json = not stream.isatty()
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json
        else structlog.dev.ConsoleRenderer(colors=stream.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping().get(level_name, logging.INFO)
        ),
        logger_factory=structlog.PrintLoggerFactory(stream),
        # Cached loggers are faster, but bind for good on first use; a test process that runs
        # `gpufed` commands in-process sets GPUFED_LOG_CACHE=0 so later tests can capture logs.
        cache_logger_on_first_use=os.environ.get("GPUFED_LOG_CACHE", "1") != "0",
    )
