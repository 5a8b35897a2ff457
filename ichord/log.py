"""Structured logging: structlog JSON lines, stdlib logging routed through it, the scrubber last.

The scrubber runs as a processor on every event dict, so even a careless ``log.info(..., err=exc)``
cannot put key or certificate material on a line (it is the last line of defence, not the first).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from ichord.pki.scrub import SCRUBBER


def _scrub_processor(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        if key == "exc_info" and value:
            continue  # rendered below by format_exc_info, then scrubbed as "exception"
        event[key] = SCRUBBER.value(value)
    return event


def _scrub_exception(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    if "exception" in event:
        event["exception"] = SCRUBBER.text(str(event["exception"]))
    return event


def configure(level: str = "info", *, json: bool = True, stream: TextIO | None = None) -> None:
    """Configure structlog and stdlib logging once per process."""
    out = stream or sys.stderr
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _scrub_processor,
        structlog.processors.format_exc_info,
        _scrub_exception,
    ]
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Third-party chatter stays at warning whatever the level: kubernetes_asyncio's debug lines print
    # whole response bodies (Secrets included, in encodings the scrubber cannot know), hpack and
    # grpclib print frames.
    for noisy in ("aiohttp.access", "hpack", "grpclib", "kubernetes_asyncio"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


def get_logger(name: str | None = None, **bound: Any) -> Any:
    return structlog.get_logger(name).bind(**bound)
