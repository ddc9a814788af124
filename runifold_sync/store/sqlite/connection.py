"""One SQLite connection of the store and the store's time format.

A connection belongs to the process that opened it and waits for the database lock
itself, in short random pauses; store time is kept in integer microseconds so a time
the store handed out compares exactly when it comes back.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ...errors import StoreNotWritable, StoreUnavailable, StoreUsedAcrossFork
from ..timing import PoolWaits
from .clock import HOST_CLOCK

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)
# Pauses between tries for the database lock: random up to this, doubling to the cap.
_FIRST_LOCK_PAUSE_S = 0.0005
_MAX_LOCK_PAUSE_S = 0.005


def time_at(epoch_us: int) -> datetime:
    """Store time (epoch microseconds, as SQLite keeps it) as an aware datetime."""
    return EPOCH + timedelta(microseconds=epoch_us)


def in_us(value: datetime | timedelta) -> int:
    """A datetime as epoch microseconds, or a duration in microseconds, exactly."""
    if isinstance(value, datetime):
        value = value - EPOCH
    return value // MICROSECOND


# Primary result codes of a database this process may not write (or create files beside).
_NOT_WRITABLE = (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM)


def store_error(message: str, path: str, exc: sqlite3.Error) -> StoreUnavailable:
    """The store error for ``exc``: :class:`StoreNotWritable`, saying why, when the file
    cannot be written by this process, else :class:`StoreUnavailable`."""
    if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _NOT_WRITABLE:
        return StoreUnavailable(f"{message}: {exc}")
    return StoreNotWritable(f"{message}: {exc} ({why_not_writable(path)})")


def why_not_writable(path: str) -> str:
    """What stops this process reading or writing the database at ``path``, as far as it
    can tell: a file it may not read is said to be unreadable (SQLite reports both as
    "unable to open"), a file it may read but not write to be read-only to it."""
    directory = os.path.dirname(os.path.abspath(path))
    who = f"uid {os.geteuid()}"
    if os.path.exists(path):
        access = (("readable", os.R_OK), ("writable", os.W_OK))
        denied = [what for what, flag in access if not os.access(path, flag)]
        if denied:
            mode = os.stat(path).st_mode & 0o777
            return f"the file {path!r} is not {' or '.join(denied)} by this process ({who}, mode {mode:04o})"
    if not os.access(directory, os.W_OK):
        return (
            f"the directory {directory!r} is not writable by this process ({who}); SQLite "
            "creates the database's -wal and -shm files beside it"
        )
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        return f"the filesystem holding {directory!r} is mounted read-only"
    return "no permission or read-only mount explains it; see the SQLite error"


def _enable_wal(raw: sqlite3.Connection, busy_timeout_s: float) -> None:
    """Switch a database to WAL, waiting out other connections doing the same.

    Changing the journal mode of a fresh file takes a lock that SQLite reports as busy
    at once, without its busy handler, when another connection is switching it too; so
    several processes starting on a new database retry here within the busy timeout.
    """
    deadline = time.monotonic() + busy_timeout_s
    while True:
        try:
            raw.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.005)


class SqliteConnection:
    """A sqlite3 connection bound to the process that opened it.

    It waits for the database lock itself (:meth:`execute`) rather than through SQLite's
    busy handler. That handler sleeps 1, 2, 5, 10 ... up to 100 ms between tries, while a
    busy writer frees the lock for well under a millisecond between its transactions: a
    waiter then kept missing those gaps, and of four processes claiming from one file,
    one often did nearly all the work while the others waited.
    """

    def __init__(self, path: str, synchronous: str, busy_timeout_s: float) -> None:
        self.pid = os.getpid()
        self.busy_timeout_s = busy_timeout_s
        # The boot clock as stamped by execute() for the statement it starts, and for the
        # rest of a transaction it began: one store time per statement or transaction.
        self.stamp_us = HOST_CLOCK.uptime_us()
        self.waits = PoolWaits()  # statements that may wait for the lock, and their waits
        # Each connection serves one thread (see _conn); check_same_thread=False only lets
        # close() release connections of threads that have finished.
        self.raw = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
        self.raw.row_factory = sqlite3.Row
        self.raw.create_function("runifold_uptime_us", 0, lambda: self.stamp_us)
        _enable_wal(self.raw, busy_timeout_s)
        self.raw.execute(f"PRAGMA synchronous={synchronous}")

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        """Run a statement that may have to wait for the database lock (one that starts a
        transaction, or a single statement in autocommit mode): a refused try changed
        nothing, so it is tried again, after a short random pause, until the busy timeout."""
        refused_at: float | None = None  # when the first try was refused
        pause_s = _FIRST_LOCK_PAUSE_S
        while True:
            self.stamp_us = HOST_CLOCK.uptime_us()
            try:
                cursor = self.raw.execute(sql, params)
                if refused_at is None:  # PoolWaits.add(0.0), as most statements count
                    self.waits.requests += 1
                else:
                    self.waits.add(time.monotonic() - refused_at)
                return cursor
            except sqlite3.OperationalError as exc:
                # Errors the sqlite3 module raises itself carry no SQLite code.
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
                now = time.monotonic()
                if refused_at is None:
                    refused_at = now
                if now >= refused_at + self.busy_timeout_s:
                    self.waits.add(now - refused_at)
                    raise
            time.sleep(random.uniform(0, pause_s))
            pause_s = min(pause_s * 2, _MAX_LOCK_PAUSE_S)

    def check_pid(self) -> None:
        if self.pid != os.getpid():
            raise StoreUsedAcrossFork(
                f"this store's SQLite connection was opened in process {self.pid} and "
                f"cannot be used in forked process {os.getpid()}; open a new store after fork"
            )


def create_private(path: str) -> None:
    """Create a new database file readable by its owner only (0600): it holds inputs and
    results. SQLite gives its -wal and -shm files the same permissions. An existing file
    keeps its own."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass
    except PermissionError as exc:
        raise StoreNotWritable(f"cannot create SQLite database {path!r}: {why_not_writable(path)}") from exc
    except OSError as exc:
        raise StoreUnavailable(f"cannot create SQLite database {path!r}: {exc.strerror}") from exc
