"""Telling an operator, once, that a store stopped answering, and once that it is back.

During a database outage every part of a worker fails at its own pace: the pool's
reconnection attempts, each cycle, each heartbeat, the worker registry update. Logged one
by one, with tracebacks, they bury the one fact that matters (this database is down
since then) under a flood, and the first of them came from psycopg alone, up to the pool
timeout (30 s) before any store call gave up. So every failure that means "unavailable"
is reported here instead: the first of an outage is one warning naming the store and
why, the rest are debug lines, and the first success after it is one line saying how long
it lasted. Each store (so each worker process) has one, shared by its threads.
"""

from __future__ import annotations

import logging
import threading
import time

from ..errors import StoreClosed, StoreNotWritable, StoreUnavailable
from ..model.redaction import scrubbed

log = logging.getLogger("runifold_sync.store")


def is_outage(exc: BaseException) -> bool:
    """An error that waiting out may cure: the store unreachable or failing, not one
    that refuses this process's writes (an operator must act) nor one closed by its owner."""
    return isinstance(exc, StoreUnavailable) and not isinstance(exc, (StoreNotWritable, StoreClosed))


def _reason(exc: BaseException, where: str) -> str:
    """The error on one line, without the store's name (the report says it once)."""
    text = " ".join(str(exc).split())
    return text.removeprefix(f"{where}: ") or type(exc).__name__


class OutageLog:
    """The reachability of the store ``where`` names (``PostgreSQL database app at
    db:5432``), as the log tells it. ``connection`` is the URL or conninfo, whose
    passwords are masked in anything logged."""

    def __init__(self, where: str, connection: str = "") -> None:
        self.where = where
        self._connection = connection
        self._lock = threading.Lock()
        self._down_since: float | None = None  # monotonic time of the first failure
        self._failures = 0

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, exc: BaseException, during: str) -> None:
        """The store did not answer ``during`` (``"connecting"``, ``"a cycle"``...)."""
        reason = scrubbed(_reason(exc, self.where), self._connection)
        with self._lock:
            self._failures += 1
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
        if first:
            log.warning("%s is unavailable, retrying until it answers (%s: %s)", self.where, during, reason)
        else:
            log.debug("%s still unavailable (%s: %s)", self.where, during, reason)

    def answered(self) -> None:
        """The store answered: if it was down, say it is back. Cheap when it was not."""
        if self._down_since is None:
            return
        with self._lock:
            since, failures = self._down_since, self._failures
            self._down_since, self._failures = None, 0
        if since is not None:
            log.warning(
                "%s is available again after %.1f s (%d failed operations meanwhile)",
                self.where,
                time.monotonic() - since,
                failures,
            )

    def report(self, logger: logging.Logger, message: str, exc: Exception, extra: dict[str, object]) -> None:
        """Log ``message`` about ``exc``, caught where a background operation failed: an
        outage goes through :meth:`failed` (no traceback), a store refusing writes is one
        line with its reason, anything else (a bug) is logged with its traceback."""
        if is_outage(exc):
            self.failed(exc, message)
        elif isinstance(exc, StoreUnavailable):
            logger.warning("%s: %s", message, exc, extra=extra)
        else:
            logger.exception(message, extra=extra)
