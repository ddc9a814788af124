"""Log records that say which task, worker and lease they are about.

Records about a task carry ``task_id``, ``worker_id`` and ``fencing_token`` as ``extra``
fields, so an operator can follow one task across the processes of a pool and tell a
stale owner's lines (a lower fencing token) from the current one's. The formatters put
those fields on every line: ``key=value`` after the message, or one JSON object per line
for log shippers.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Literal

from ..store.records import Lease

FIELDS = ("task_id", "worker_id", "fencing_token")
LogFormat = Literal["text", "json"]


def task_fields(lease: Lease) -> dict[str, object]:
    """The ``extra`` of a record about the task ``lease`` holds."""
    return {"task_id": lease.task_id, "worker_id": lease.worker_id, "fencing_token": lease.fencing_token}


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in FIELDS if hasattr(record, name)}


class TextFormatter(logging.Formatter):
    """``time level logger [pid] message task_id=... worker_id=... fencing_token=...``;
    the pid tells the forked workers of one pool apart."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        line = super().formatMessage(record)
        fields = " ".join(f"{name}={value}" for name, value in _fields(record).items())
        return f"{line} {fields}" if fields else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC), level, logger, pid, message, the task fields
    present, and the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
            **_fields(record),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(level: str, log_format: LogFormat) -> None:
    """Log to stderr in ``log_format`` at ``level``, unless the process configured logging
    already (an application, or a test harness): its configuration is kept, as
    ``logging.basicConfig`` does."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
