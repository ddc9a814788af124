"""The ledger that the step bodies of subprocess apps write: one line per body that
started, outside the store, so a test counts what really ran even in processes it
killed. ``O_APPEND`` keeps the lines of concurrent processes whole; a durable line is
also fsynced before the body goes on."""

from __future__ import annotations

import os
from pathlib import Path


def append(path: str | Path, *fields: object, durable: bool = True) -> None:
    """Append one line of space-separated ``fields``; ``durable=False`` skips the fsync
    (for apps whose steps are too many and short to pay one each)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (" ".join(str(field) for field in fields) + "\n").encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def read(path: str | Path) -> list[list[str]]:
    """The fields of every line so far, in order; none before the first line."""
    path = Path(path)
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []
