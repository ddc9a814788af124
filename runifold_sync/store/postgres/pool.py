"""The PostgreSQL store's connections: a ``psycopg_pool.ConnectionPool`` bound to the
process that opened it, and the one place where driver errors become
:class:`StoreUnavailable`.

A pool never crosses a fork: its worker threads do not exist in a child and its sockets
are shared with the parent. Any use from another pid is refused with a message that says
what to do, and ``close()`` in a child leaves the parent's connections alone.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Self

import psycopg
import psycopg.errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool

from ...errors import (
    InvalidArgument,
    StoreClosed,
    StoreMisconfigured,
    StoreNotWritable,
    StoreUnavailable,
    StoreUsedAcrossFork,
)
from ...model.redaction import redacted, scrubbed
from ...model.values import check_int
from ..outage import OutageLog
from ..timing import PoolWaits

Connection = psycopg.Connection[DictRow]

# A connection idle longer than this is checked (one empty query) before it is handed out:
# a server restart breaks idle connections, and checking them replaces them instead of
# failing the caller. One used more recently skips the round trip, which otherwise came
# with every statement; if the server restarted in between, that statement fails with
# StoreUnavailable (ending the cycle, not the task) and the broken connection is dropped.
_CHECK_AFTER_IDLE_S = 1.0
_POOL_NAME = "runifold"
# How psycopg_pool logs each failed reconnection (psycopg_pool/pool.py, _add_connection).
_RECONNECT_FAILED = "error connecting in %r: %s"


# A statement prepared on one server connection, run on another (or prepared twice): what
# a transaction pooler does when the URL does not say it is there.
_PREPARED_ELSEWHERE = (
    "{where}: {error}: a transaction-pooling PgBouncer (or another transaction pooler) is "
    "between this process and the server and the URL does not say so: the next transaction "
    "ran on another server connection, without the statements this one had prepared. "
    "Add pgbouncer=true to the store URL (?pgbouncer=true; with listen_host and listen_port "
    "naming the server itself, idle workers LISTEN there instead of polling)"
)


def _named(exc: psycopg.Error) -> str:
    return f"{type(exc).__name__}: {exc}"


class PooledConnection(psycopg.Connection[DictRow]):
    """A connection that remembers when it last went back to the pool, with one cursor
    kept for single statements."""

    returned_at: float = float("-inf")
    _kept_cursor: psycopg.Cursor[DictRow] | None = None

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        """psycopg's connect, telling the pool's :class:`OutageLog` (passed among the
        pool's connection arguments as ``outage``) how it went. During an outage the
        pool's background reconnections fail long before any caller's wait for a
        connection times out, so they are the first sign of it and the first of recovery."""
        outage: OutageLog | None = kwargs.pop("outage", None)
        try:
            conn = super().connect(conninfo, **kwargs)
        except psycopg.OperationalError as exc:
            if outage is not None:
                outage.failed(exc, "connecting")
            raise
        if outage is not None:
            outage.answered()
        return conn

    def kept_cursor(self) -> psycopg.Cursor[DictRow]:
        """A cursor reused by every single-statement call on this connection. A new
        cursor per statement was about a quarter of psycopg's client CPU for it (11 of
        40 µs, measured); the holder of the connection reads each result before the
        next statement, so one cursor serves them all."""
        if self._kept_cursor is None:
            self._kept_cursor = self.cursor()
        return self._kept_cursor


def _check_if_idle(conn: PooledConnection) -> None:
    if time.monotonic() - conn.returned_at > _CHECK_AFTER_IDLE_S:
        ConnectionPool.check_connection(conn)


def describe(url: str) -> str:
    """Where a URL or conninfo points, without its password, for error messages."""
    try:
        parts = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise InvalidArgument(
            f"invalid PostgreSQL URL or connection string {redacted(url)!r}: {scrubbed(str(exc), url)}"
        ) from exc
    host, port = parts.get("host") or "local socket", parts.get("port") or 5432
    where = f"PostgreSQL database {parts.get('dbname') or '(default)'!s} at {host}:{port}"
    # A password holding '@' ends, for libpq, at the first one: the rest became the host.
    return scrubbed(where, url)


class _ReconnectsReported(logging.Filter):
    """Drops psycopg_pool's warning for each failed reconnection of a runifold pool: the
    pool retries every second or so through an outage, and :meth:`PooledConnection.connect`
    has reported each attempt to the store's :class:`OutageLog` (one warning per outage,
    the rest at debug level). Other pools' records pass untouched."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (record.msg == _RECONNECT_FAILED and isinstance(args, tuple) and args[:1] == (_POOL_NAME,))


def _quiet_reconnect_warnings() -> None:
    """Install :class:`_ReconnectsReported` on psycopg_pool's logger, once per process."""
    logger = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, _ReconnectsReported) for f in logger.filters):
        logger.addFilter(_ReconnectsReported())


def _configure(conn: Connection) -> None:
    """Every store statement is short OLTP work. A claim's lateral join can be estimated
    above ``jit_above_cost`` (10,000 waiting tasks were enough), and compiling it then
    took about 50 ms a claim, forty times the query itself: JIT stays off. Behind a
    transaction pooler no session setting sticks; the README says to turn JIT off for the
    database instead (``ALTER DATABASE ... SET jit = off``)."""
    conn.execute("SET jit = off")


class ProcessPool:
    """Autocommit, dict-row connections for one process."""

    def __init__(self, pool: ConnectionPool[PooledConnection], where: str, outage: OutageLog) -> None:
        self.where = where
        self.outage = outage
        self._pool = pool
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(
        cls,
        url: str,
        *,
        min_size: int,
        max_size: int,
        connect_timeout: timedelta,
        pool_timeout: timedelta,
        pgbouncer: bool = False,
    ) -> ProcessPool:
        """The pool on ``url`` (libpq's form, see ``pgurl``). Behind a transaction pooler
        (``pgbouncer``) no statement is prepared and no session setting is made: the next
        transaction may run on another server connection."""
        check_int("min_size", min_size, minimum=0)
        check_int("max_size", max_size, minimum=max(min_size, 1))
        for name, value in (("connect_timeout", connect_timeout), ("pool_timeout", pool_timeout)):
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise InvalidArgument(f"{name} must be a positive timedelta, got {value!r}")
        where = describe(url)
        outage = OutageLog(where, url)
        _quiet_reconnect_warnings()
        # One direct connection first: the pool retries in the background and would hide
        # the reason (refused, no such database, authentication) behind a timeout.
        try:
            psycopg.connect(url, connect_timeout=max(2, math.ceil(connect_timeout.total_seconds()))).close()
            pool = ConnectionPool(
                url,
                connection_class=PooledConnection,
                kwargs={"autocommit": True, "row_factory": dict_row, "outage": outage}
                | ({"prepare_threshold": None} if pgbouncer else {}),
                min_size=min_size,
                max_size=max_size,
                timeout=pool_timeout.total_seconds(),
                check=_check_if_idle,
                configure=None if pgbouncer else _configure,
                name=_POOL_NAME,
                open=True,
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to {where}: {scrubbed(str(exc), url)}") from exc
        opened = cls(pool, where, outage)
        if min_size:
            try:
                pool.wait(timeout=connect_timeout.total_seconds())
            except psycopg.Error as exc:
                opened.close()
                raise StoreUnavailable(
                    f"cannot connect to {where} within {connect_timeout}: {scrubbed(str(exc), url)}"
                ) from exc
        return opened

    @contextmanager
    def connection(self) -> Iterator[PooledConnection]:
        """A pooled connection in autocommit mode. Driver errors raised while it is held
        become :class:`StoreUnavailable`, except a value the database refuses (SQLSTATE
        class 22), which is :class:`InvalidArgument`; the store's own errors pass through."""
        if self._closed:
            raise StoreClosed(f"store on {self.where} is closed")
        if self._pid != os.getpid():
            raise StoreUsedAcrossFork(
                f"store on {self.where} was opened in process {self._pid} and cannot be used "
                f"in forked process {os.getpid()}: a connection pool never crosses a fork; "
                "open a new store in the child after it starts"
            )
        try:
            with self._pool.connection() as conn:
                try:
                    yield conn
                finally:
                    conn.returned_at = time.monotonic()
        except (psycopg.errors.InvalidSqlStatementName, psycopg.errors.DuplicatePreparedStatement) as exc:
            raise StoreMisconfigured(_PREPARED_ELSEWHERE.format(where=self.where, error=_named(exc))) from exc
        except (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction) as exc:
            # Missing privileges or a read-only (standby) server: an operator must act.
            raise StoreNotWritable(f"{self.where} refused a write: {type(exc).__name__}: {exc}") from exc
        except psycopg.DataError as exc:
            # A value the database cannot hold (out of range, malformed): the caller's
            # value, not an outage, so it is not retried as one.
            raise InvalidArgument(f"{self.where} refused a value: {type(exc).__name__}: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreUnavailable(f"{self.where}: {type(exc).__name__}: {exc}") from exc

    def execute(self, query: str, params: Mapping[str, Any]) -> None:
        """One statement without a result, in its own transaction (autocommit)."""
        with self.connection() as conn:
            conn.kept_cursor().execute(query, params)

    def fetch_one(self, query: str, params: Mapping[str, Any]) -> DictRow | None:
        """One statement in its own transaction (autocommit) and its first row."""
        with self.connection() as conn:
            return conn.kept_cursor().execute(query, params).fetchone()

    def fetch_all(self, query: str, params: Mapping[str, Any]) -> list[DictRow]:
        """One statement in its own transaction (autocommit) and all its rows."""
        with self.connection() as conn:
            return conn.kept_cursor().execute(query, params).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection inside one transaction, committed on success."""
        with self.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def pipelined_transaction(self) -> Iterator[Connection]:
        """A connection inside one transaction whose statements are sent in pipeline
        mode, committed on success and rolled back on any error.

        The transaction is begun and committed with plain statements: psycopg's
        ``conn.transaction()`` inside a pipeline synchronizes on entry and exit, which
        cost about 150 µs of client CPU per transaction (measured), as much as the
        statements themselves."""
        with self.connection() as conn:
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    yield conn
                    conn.execute("COMMIT")
            except BaseException:
                if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    conn.rollback()
                raise

    def pool_waits(self) -> PoolWaits:
        """psycopg_pool's own counts since the last call: requests, those queued for a
        free connection, and their total wait."""
        stats = self._pool.pop_stats()
        return PoolWaits(
            stats.get("requests_num", 0),
            stats.get("requests_queued", 0),
            stats.get("requests_wait_ms", 0) / 1000,
        )

    def close(self) -> None:
        """Idempotent. In a forked child it only marks the pool closed."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._pid == os.getpid():
            self._pool.close()
