"""The process's log output: readable lines for a person, or one JSON object per line for machines.

``router serve --log-level LEVEL --log-format text|json`` (env ``ROUTER_LOG_LEVEL``,
``ROUTER_LOG_FORMAT``). At ``info`` the router says one line per request (``router.requests``);
fallbacks, breaker changes and degraded shared state are ``warning``s. uvicorn's own loggers go
through the same handler, so a JSON log has no plain lines mixed in.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and a request's fields when present."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            out["event"] = event
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


class _Handler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Ours, so that configuring again replaces it and leaves anyone else's (a test harness's) alone.

    It writes to ``sys.stderr`` as it is when a record is emitted (as ``logging.lastResort`` does),
    not as it was when configured: a harness that swapped stderr and closed its copy since must
    not turn every later line into a "Logging error".
    """

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def configure(level: str = "info", fmt: str = "text") -> None:
    """Log to stderr at ``level`` in ``fmt`` (calling again switches level or format)."""
    handler = _Handler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
