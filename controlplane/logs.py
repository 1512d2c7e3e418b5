"""Process logging: plain text for people, or one JSON object per line for log pipelines.

JSON lines carry `ts`, `level`, `logger` and `message`, plus the context fields that apply, passed by
the call sites with `extra=` (`workload`, `run`, `cluster`, `epoch`, ...) or taken from the request
being served (`request_id`, set by the API's request-id middleware in a context variable, so every
line logged while serving a request carries it, also from the threads that run sync routes).

Secrets never belong in a log line; as a backstop both formats blank anything that looks like a
bearer token or a gpufleet API token or cluster credential.
"""

from __future__ import annotations

import json
import logging
import re
from contextvars import ContextVar
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The fields a log call may add with `extra=` that JSON lines carry (nothing else is copied: a
# record's other attributes are logging internals).
CONTEXT_FIELDS = (
    "workload",
    "run",
    "cluster",
    "epoch",
    "team",
    "queue",
    "consumer",
    "method",
    "path",
    "status",
    "duration_ms",
)
MAX_MESSAGE_CHARS = 8000

request_id: ContextVar[str | None] = ContextVar("gpufleet_request_id", default=None)

_SECRET = re.compile(r"(?i)\b(bearer\s+)\S+|\bgp[fc]_[A-Za-z0-9_-]{8,}")


def redact(text: str) -> str:
    """`text` with bearer tokens and gpufleet tokens/credentials replaced by `[redacted]`."""
    return _SECRET.sub(lambda m: (m.group(1) or "") + "[redacted]", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": redact(message)[:MAX_MESSAGE_CHARS],
        }
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                entry[name] = value if isinstance(value, int | float | bool) else redact(str(value))[:500]
        current = request_id.get()
        if current is not None:
            entry["request_id"] = current
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = redact(super().format(record))
        current = request_id.get()
        return f"{text} [request {current}]" if current is not None else text


def configure(log_format: str = "text", verbose: bool = False, log_file: Path | None = None) -> None:
    """Send every logger's records to stderr in `log_format` (`text` or `json`), replacing any
    handler set up before (also uvicorn's own, whose lines then share the format).

    With `log_file` (what `gpufleet up` uses), every record goes to that file instead and stderr
    gets warnings and errors only: the console of a process that also talks to a person (the
    banner, the demo's story) stays readable. `verbose` puts every record on stderr as well."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {log_format!r}")
    level = logging.DEBUG if verbose else logging.INFO
    console = logging.StreamHandler()
    handlers: list[logging.Handler] = [console]
    if log_file is not None:
        console.setLevel(level if verbose else logging.WARNING)
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        if isinstance(old, logging.FileHandler):
            old.close()
    for handler in handlers:
        handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
        root.addHandler(handler)
    root.setLevel(level)
    logging.getLogger("nats").setLevel(logging.WARNING)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
