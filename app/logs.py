"""Log lines as text or as JSON (LOG_FORMAT), with the fields that join them: the request id of
the HTTP request being served (from ``X-Request-ID``, set by app.edge) and, on a summary's lines,
its ``memory_id``, ``conversation_id`` and the request id of the round that made it due when that
round was posted to this process.

The fields live in one context variable: a request runs in its own task, and so does each
summary (app.memory.runner), so what one binds is never seen by another. The messages themselves
are the same in both formats (seed 004's lines included), and never hold message content.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar, Token
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s [%(name)s] %(message)s"

_fields: ContextVar[Mapping[str, Any]] = ContextVar("log_fields", default=MappingProxyType({}))


def bind(**fields: Any) -> Token[Mapping[str, Any]]:
    """Add fields to this task's log lines, until ``unbind`` with the returned token."""
    return _fields.set({**_fields.get(), **fields})


def unbind(token: Token[Mapping[str, Any]]) -> None:
    _fields.reset(token)


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    token = bind(**fields)
    try:
        yield
    finally:
        unbind(token)


def fields() -> Mapping[str, Any]:
    return _fields.get()


def request_id() -> str | None:
    """The id of the HTTP request this task serves (or of the round a summary came from)."""
    value = _fields.get().get("request_id")
    return value if isinstance(value, str) else None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: timestamp (UTC, ISO 8601), level, logger, message, request_id,
    the bound fields, and the traceback when there is one. ASCII-only, so a line never breaks
    and never fails to encode."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": None,
            **_fields.get(),
        }
        if record.exc_info:
            payload["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            payload["stack"] = self.formatStack(record.stack_info)
        return json.dumps(payload, default=str)


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
