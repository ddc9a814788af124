"""The PostgreSQL store's connections: a ``psycopg_pool.ConnectionPool`` bound to the
process that opened it, and the one place where driver errors become
:class:`StoreUnavailable`.

A pool never crosses a fork: its worker threads do not exist in a child and its sockets
are shared with the parent. Any use from another pid is refused with a message that says
what to do, and ``close()`` in a child leaves the parent's connections alone.

A network that drops packets must not hold a caller for minutes (the kernel retransmits
an unanswered statement for about fifteen). So every connection carries libpq's network
timeouts (``connect_timeout``, TCP keepalives, ``tcp_user_timeout``), derived from the
lease of the workers using the store (:func:`network_params`) unless the URL sets them,
and once a worker has said its lease (:meth:`ProcessPool.bound_by_lease`), each
statement must answer within half a lease (and the caller's patience, ``retries``): one
that does not closes its connection and fails. A connection the server dropped while it
sat in the pool is found at checkout, before anything is sent on it.
"""

from __future__ import annotations

import logging
import math
import os
import select
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Self, TypeVar

import psycopg
import psycopg.errors
from psycopg.abc import PQGen
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import DictRow, dict_row
from psycopg_pool import ConnectionPool
from psycopg_pool.pool import AddConnection, MaintenanceTask

from ...errors import (
    InvalidArgument,
    StoreClosed,
    StoreMisconfigured,
    StoreNotWritable,
    StoreUnavailable,
    StoreUsedAcrossFork,
)
from ...model import validate
from ...model.redaction import redacted, scrubbed
from .. import retries
from ..outage import OutageLog
from ..timing import PoolWaits

RV = TypeVar("RV")

Connection = psycopg.Connection[DictRow]

# A connection idle longer than this is checked (one empty query) before it is handed out:
# a server restart or a broken network leaves idle connections dead, and checking them
# replaces them instead of failing the caller. One used more recently skips the round
# trip, which otherwise came with every statement, unless the server has sent it
# something since (a terminated backend's goodbye: see _unusable).
_CHECK_AFTER_IDLE_S = 1.0
_POOL_NAME = "runifold"
# How psycopg_pool logs each failed reconnection (psycopg_pool/pool.py, _add_connection).
_RECONNECT_FAILED = "error connecting in %r: %s"
# The longest pause between two reconnection attempts. psycopg_pool doubles it from 1 s
# up to its reconnect timeout: after a two-minute outage the next attempt came up to a
# minute after the server was back, and every caller waited for it.
_RECONNECT_PAUSE_MAX_S = 0.5
# The lease the network timeouts are derived from until a worker says its own.
DEFAULT_LEASE_S = 30.0
# No statement is cut off sooner than this, whatever the lease: on a loaded host a
# healthy answer can take a few hundred milliseconds.
_MIN_CALL_BOUND_S = 1.0
# psycopg's interval for checking Ctrl-C while it waits (psycopg.connection._WAIT_INTERVAL).
_WAIT_INTERVAL_S = 0.1


def network_params(conninfo: str, lease_s: float) -> dict[str, int]:
    """libpq's network timeouts for workers whose leases last ``lease_s``, those the
    URL or conninfo does not set itself (the user's values win). A dead peer is noticed
    well within a lease: a connection attempt gives up after a quarter of it (libpq's
    minimum is 2 s), an idle connection is probed after a quarter and dropped after three
    unanswered probes, and data unacknowledged for half a lease drops the connection."""
    given = conninfo_to_dict(conninfo)
    derived = {
        "connect_timeout": min(max(2, math.ceil(lease_s / 4)), 10),
        "keepalives": 1,
        "keepalives_idle": min(max(1, int(lease_s / 4)), 30),
        "keepalives_interval": min(max(1, int(lease_s / 8)), 10),
        "keepalives_count": 3,
        "tcp_user_timeout": min(max(1000, int(lease_s * 500)), 60_000),
    }
    return {key: value for key, value in derived.items() if key not in given}


def with_network_params(conninfo: str, lease_s: float = DEFAULT_LEASE_S) -> str:
    """``conninfo`` with :func:`network_params` added (for the store's own connections
    outside the pool: the LISTEN connections)."""
    return make_conninfo(conninfo, **network_params(conninfo, lease_s))


def call_bound_s(lease_s: float) -> float:
    """How long one statement of a worker with leases of ``lease_s`` may take: half the
    lease, leaving the other half to try again on a fresh connection."""
    return max(lease_s / 2, _MIN_CALL_BOUND_S)


class CallTimedOut(psycopg.OperationalError):
    """A statement got no answer by its deadline; its connection was closed."""


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
    # Monotonic time by which the statement under way must have its answer, while the
    # connection is lent out (ProcessPool.connection); None: no bound.
    deadline: float | None = None

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

    def wait(self, gen: PQGen[RV], interval: float = _WAIT_INTERVAL_S, timeout: float | None = None) -> RV:
        """psycopg's wait for the server, ended at :attr:`deadline`: the connection is then
        in the middle of a statement, so it is closed (the pool replaces it) and the
        statement fails with :class:`CallTimedOut`. A caller's shorter ``timeout`` (a wait
        for notifications) is its own and ends as psycopg ends it."""
        deadline = self.deadline
        if deadline is not None:
            left_s = max(deadline - time.monotonic(), 0.0)
            if timeout is None or left_s < timeout:
                try:
                    return super().wait(gen, interval, left_s)
                except psycopg.errors._WaitTimeout:  # what psycopg's own timed waits catch
                    self.pgconn.finish()
                    raise CallTimedOut("no answer in time; the connection was closed") from None
        return super().wait(gen, interval, timeout)

    def kept_cursor(self) -> psycopg.Cursor[DictRow]:
        """A cursor reused by every single-statement call on this connection. A new
        cursor per statement was about a quarter of psycopg's client CPU for it (11 of
        40 µs, measured); the holder of the connection reads each result before the
        next statement, so one cursor serves them all."""
        if self._kept_cursor is None:
            self._kept_cursor = self.cursor()
        return self._kept_cursor


def _unusable(conn: PooledConnection) -> bool:
    """Whether a connection just taken from the pool cannot serve (it is then closed, and
    the pool replaces it). Nothing has been sent on it yet, so the caller takes another
    without any doubt about its statement. A terminated backend says so and closes the
    socket, so an idle connection with bytes waiting (one poll of the socket) is checked
    with a round trip, as is one idle for over ``_CHECK_AFTER_IDLE_S`` (a restarted
    server, a broken network); the rare one holding a notice or notification passes.
    The check is made here rather than by psycopg_pool, which sleeps a second, then two,
    four... after each failed check in a row: with backends killed every few hundred
    milliseconds a caller waited out its whole timeout."""
    try:
        if time.monotonic() - conn.returned_at > _CHECK_AFTER_IDLE_S or _has_input(conn):
            ConnectionPool.check_connection(conn)
    except (OSError, psycopg.Error):
        conn.close()
        return True
    return False


def _has_input(conn: PooledConnection) -> bool:
    poller = select.poll()
    poller.register(conn.pgconn.socket, select.POLLIN)
    return bool(poller.poll(0))


class _Pool(ConnectionPool[PooledConnection]):
    """psycopg_pool's pool with the pause between reconnection attempts kept short (see
    ``_RECONNECT_PAUSE_MAX_S``): each attempt is itself bounded by ``connect_timeout``."""

    def schedule_task(self, task: MaintenanceTask, delay: float) -> None:
        if isinstance(task, AddConnection):
            delay = min(delay, _RECONNECT_PAUSE_MAX_S)
        super().schedule_task(task, delay)


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

    def __init__(
        self, pool: ConnectionPool[PooledConnection], where: str, outage: OutageLog, url: str = ""
    ) -> None:
        self.where = where
        self.outage = outage
        self._pool = pool
        self._url = url
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._closed = False
        self._lease_s = DEFAULT_LEASE_S  # what the connections' network timeouts come from
        self._call_bound_s: float | None = None  # set by the first worker's lease

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
        validate.integer("min_size", min_size, minimum=0)
        validate.integer("max_size", max_size, minimum=max(min_size, 1))
        validate.positive_duration("connect_timeout", connect_timeout)
        validate.positive_duration("pool_timeout", pool_timeout)
        where = describe(url)
        outage = OutageLog(where, url)
        _quiet_reconnect_warnings()
        # One direct connection first: the pool retries in the background and would hide
        # the reason (refused, no such database, authentication) behind a timeout.
        try:
            psycopg.connect(url, connect_timeout=max(2, math.ceil(connect_timeout.total_seconds()))).close()
            pool = _Pool(
                url,
                connection_class=PooledConnection,
                kwargs={"autocommit": True, "row_factory": dict_row, "outage": outage}
                | network_params(url, DEFAULT_LEASE_S)
                | ({"prepare_threshold": None} if pgbouncer else {}),
                min_size=min_size,
                max_size=max_size,
                timeout=pool_timeout.total_seconds(),
                configure=None if pgbouncer else _configure,
                name=_POOL_NAME,
                open=True,
            )
        except psycopg.Error as exc:
            raise StoreUnavailable(f"cannot connect to {where}: {scrubbed(str(exc), url)}") from exc
        opened = cls(pool, where, outage, url)
        if min_size:
            try:
                pool.wait(timeout=connect_timeout.total_seconds())
            except psycopg.Error as exc:
                opened.close()
                raise StoreUnavailable(
                    f"cannot connect to {where} within {connect_timeout}: {scrubbed(str(exc), url)}"
                ) from exc
        return opened

    def bound_by_lease(self, lease_s: float) -> None:
        """A worker holding leases of ``lease_s`` uses this pool: from now on each
        statement must answer within :func:`call_bound_s`, and when the lease is shorter
        than the one the network timeouts were derived from, new connections replace the
        pool's with timeouts derived from it. The shortest lease of the workers sharing
        the store counts."""
        with self._lock:
            bound_s = call_bound_s(lease_s)
            if self._call_bound_s is None or bound_s < self._call_bound_s:
                self._call_bound_s = bound_s
            if lease_s >= self._lease_s:
                return
            self._lease_s = lease_s
            kwargs = self._pool.kwargs
            assert isinstance(kwargs, dict)  # ProcessPool.open gives a dict
            kwargs.update(network_params(self._url, lease_s))
        self._pool.drain()

    @contextmanager
    def connection(self, *, longer_by_s: float = 0.0) -> Iterator[PooledConnection]:
        """A pooled connection in autocommit mode, its statements bounded as the module
        says (and ``longer_by_s`` more: a wait for notifications). Driver errors raised
        while it is held become :class:`StoreUnavailable`, except a value the database
        refuses (SQLSTATE class 22), which is :class:`InvalidArgument`; the store's own
        errors pass through."""
        if self._closed:
            raise StoreClosed(f"store on {self.where} is closed")
        if self._pid != os.getpid():
            raise StoreUsedAcrossFork(
                f"store on {self.where} was opened in process {self._pid} and cannot be used "
                f"in forked process {os.getpid()}: a connection pool never crosses a fork; "
                "open a new store in the child after it starts"
            )
        bound_s = None if self._call_bound_s is None else self._call_bound_s + longer_by_s
        deadline = retries.attempt_deadline(bound_s)
        lent: PooledConnection | None = None  # the connection of the failure, if there was one
        try:
            for _ in range(self._pool.max_size + 1):
                left_s = None if deadline is None else deadline - time.monotonic()
                timeout_s = None if left_s is None else max(min(left_s, self._pool.timeout), 0.0)
                lent = None
                with self._pool.connection(timeout=timeout_s) as conn:
                    lent = conn
                    conn.deadline = deadline
                    if _unusable(conn):
                        continue  # the pool discards it and opens another
                    try:
                        yield conn
                    finally:
                        conn.deadline = None
                        conn.returned_at = time.monotonic()
                    return
            raise StoreUnavailable(f"{self.where}: every connection of the pool was dropped by the server")
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
            message = f"{self.where}: {type(exc).__name__}: {exc}"
            if lent is not None and lent.closed and not isinstance(exc, CallTimedOut):
                raise retries.ConnectionDropped(message) from exc
            raise StoreUnavailable(message) from exc

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
                if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
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
