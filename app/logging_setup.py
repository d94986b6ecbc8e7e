"""Logging for the service: JSON lines or console text, request and job ids, no secrets.

Standard library only, so that the worker can import `job_id_var` without the web stack.

- `configure_logging(settings)` installs one handler on the root logger (idempotent: a second
  call replaces it) and routes uvicorn's own loggers through it. uvicorn's access log is
  switched off: `app.api.access_log` writes one line per request instead, with the route
  template, the duration and the request id.
- `request_id_var` is set per request by `app.api.middleware.ServiceMiddleware`; `job_id_var`
  is for the worker to set while it runs a check. Every record carries both when set.
- `RedactFilter` removes `Authorization` / `X-API-Key` values and the configured API key from
  every message, extra field and traceback before it is written.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.settings import Settings

request_id_var: ContextVar[str | None] = ContextVar("batchplan_request_id", default=None)
job_id_var: ContextVar[str | None] = ContextVar("batchplan_job_id", default=None)

REDACTED = "[REDACTED]"

# `Authorization: Bearer k`, `authorization=Basic k`, `'x-api-key': 'k'`, `(b'authorization', b'Bearer k')`
_SECRET_HEADER = re.compile(
    r"""(?ix)
    (\b(?:authorization|x-api-key)\b['"]?\s*[:=,]\s*(?:b?['"])?)  # the name, a separator, a quote
    ((?:bearer|basic|token)\s+)?                                # an auth scheme, kept
    [^\s'",;)}\]]+                                              # the secret itself
    """
)

_SECRET_HINT = re.compile(r"(?i)authorization|x-api-key")

# Attributes every LogRecord has; anything else on a record came in through `extra=`.
_STANDARD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {
    "message",
    "asctime",
    "request_id",
    "job_id",
    "ids",  # ConsoleFormatter's
    "color_message",  # uvicorn's message with ANSI colours
}


class ContextFilter(logging.Filter):
    """Copies the request and job ids from their context variables onto each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        record.job_id = job_id_var.get()
        return True


class RedactFilter(logging.Filter):
    """Takes secrets out of messages, `extra` fields and tracebacks."""

    def __init__(self, secrets: tuple[str, ...] = ()) -> None:
        super().__init__()
        # Longest first, so that a key containing another is removed whole.
        self.secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def redact(self, text: str) -> str:
        if _SECRET_HINT.search(text):
            text = _SECRET_HEADER.sub(lambda m: m.group(1) + (m.group(2) or "") + REDACTED, text)
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        # Format once, here: the formatter then reuses the (redacted) message.
        record.msg = self.redact(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        fields = record.__dict__
        for name in fields.keys() - _STANDARD_ATTRS:
            if isinstance(value := fields[name], str):
                fields[name] = self.redact(value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id, [job_id], extras."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
        }
        job_id = getattr(record, "job_id", None)
        if job_id is not None:
            entry["job_id"] = job_id
        fields = record.__dict__
        for name in fields.keys() - _STANDARD_ATTRS:
            entry.setdefault(name, fields[name])
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


class ConsoleFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(ids)s%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        ids = [f"{k}={v}" for k in ("request_id", "job_id") if (v := getattr(record, k, None))]
        record.ids = f"[{' '.join(ids)}] " if ids else ""
        return super().format(record)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time (pytest swaps it per test)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.setStream; the target stays sys.stderr
        pass


def configure_logging(settings: Settings) -> None:
    """Set up the root logger from BATCHPLAN_LOG_FORMAT and BATCHPLAN_LOG_LEVEL."""
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if settings.log_format == "json" else ConsoleFormatter())
    handler.addFilter(ContextFilter())
    secret = settings.api_key.get_secret_value() if settings.api_key is not None else ""
    handler.addFilter(RedactFilter((secret,)))
    handler.setLevel(settings.log_level.upper())  # also holds back uvicorn's own INFO lines

    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _StderrHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level.upper())

    # uvicorn's startup and error lines go through the same handler (and its redaction).
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # One access line per request comes from app.api.access_log, not from uvicorn.
    access = logging.getLogger("uvicorn.access")
    access.handlers.clear()
    access.propagate = False
    access.disabled = True
