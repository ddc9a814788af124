"""PostgreSQL store on psycopg 3 and a ``psycopg_pool.ConnectionPool``: for several
processes and hosts claiming from one database.

- Time is the database's: ``clock_timestamp()`` plus the offset in ``runifold_clock``,
  never ``now()``, which is frozen at transaction start.
- A claim is one statement that locks candidates with ``FOR UPDATE SKIP LOCKED`` in a CTE
  and leases exactly those, with their history events; a completion that goes on to
  claim sends both in one pipelined transaction.
- A fenced transition and its history event (and NOTIFY) are one statement. Enqueue,
  retry, release, suspend and resolve ``NOTIFY runifold_tasks`` (delivered at commit) to
  wake idle workers blocked in :meth:`PostgresDialect.wait_for_work`.
- The pool belongs to the process that opened it: any use from a forked child raises
  :class:`StoreUsedAcrossFork`; open a new store in the child after it starts.
- Behind PgBouncer in transaction mode (``pgbouncer=true`` in the URL, see ``pgurl``)
  nothing is prepared and idle workers LISTEN on a direct connection or poll.
- The transitions that end a task NOTIFY ``runifold_results`` when a waiter has marked
  it awaited, and ``ctx.set_event`` always; callers of ``wait_for_task`` and
  ``get_event`` share one LISTEN connection (``pglisten``), opened at the first such wait.
- Driver errors become :class:`StoreUnavailable` in one place, ``pgpool.ProcessPool``.
- The statements, and how their values are stored, are in ``pgstatements``; the
  operations are :class:`~runifold_sync.store.base.WorkflowStore`'s, written once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg.rows import DictRow

from ...errors import CancelPending, InvalidArgument, LeaseLostError, StoreUnavailable
from ...model import validate
from ...model.checkpoint import JournalRow
from .. import checks, refusals
from ..base import WorkflowStore
from ..dialect import BULK_TASK_COLUMNS, Dialect, Event, FencedTransition, Params, Row, Transaction
from ..queries import pending_migrations
from ..records import BatchCompleted, ClaimedTask, ClaimRequest, Routes
from ..timing import PoolWaits
from ..watch import PollWatch, Watch
from . import joined as pg_joined
from .listen import ResultListener
from .pool import Connection, ProcessPool, describe, with_network_params
from .statements import (
    FlowLimitsAppeared,
    FlowSight,
    Q,
    batch_params,
    canonical,
    claim_in,
    fenced_statement,
    free_text,
    insert_event,
    journal_params,
    jsonb,
    route_params,
    store_now,
    transition_params,
    utc,
)
from .url import POLL_INTERVAL_S, PostgresTarget, parse_target
from .wait import DirectListener, notified, poll, wait_until_due, wait_woken

T = TypeVar("T")

# pg_advisory_xact_lock key that serializes migrations of one database ("RUNIFOLD").
_MIGRATION_LOCK = 0x52554E49464F4C44
_CHANNEL = "runifold_tasks"

log = logging.getLogger("runifold_sync.store")


class _NothingCompleted(Exception):
    """Raised inside a batch's transaction to roll its claim back (see ``complete_all``)."""


class PostgresTransaction:
    """One transaction on a pooled connection; store time is read when first asked
    for (most statements read the clock themselves and return it as ``at``)."""

    __slots__ = ("_now", "conn")

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._now: datetime | None = None

    def one(self, name: str, params: Mapping[str, Any]) -> DictRow | None:
        return self.conn.execute(Q[name], params).fetchone()

    def all(self, name: str, params: Mapping[str, Any]) -> list[DictRow]:
        return self.conn.execute(Q[name], params).fetchall()

    def count(self, name: str, params: Mapping[str, Any]) -> int:
        return self.conn.execute(Q[name], params).rowcount

    def now(self) -> datetime:
        if self._now is None:
            self._now = store_now(self.conn)
        return self._now

    def connection(self) -> Connection:
        return self.conn


class JoinedPostgresTransaction(PostgresTransaction):
    """The application's own transaction (``enqueue(..., connection=)``, a transaction
    step on Django's connection): the store's statements read rows as dicts through
    :class:`~.pg_joined.DictRows`, and a step's ``ctx.connection`` is the application's
    connection itself."""

    __slots__ = ()

    def connection(self) -> Any:
        return self.conn.connection


class PostgresDialect(Dialect):
    """Statements on a :class:`ProcessPool`; behind a transaction pooler, LISTEN on
    ``listener`` (or poll when there is none)."""

    prune_queries = ("prune_rows",)  # one statement of data-modifying CTEs: one round trip

    def __init__(
        self,
        pool: ProcessPool,
        *,
        pooled: bool = False,
        listener: DirectListener | None = None,
        results: ResultListener | None = None,
    ) -> None:
        self.pool = pool
        self.outage = pool.outage
        self.pooled = pooled
        self.listener = listener
        self.results = results  # None: watches of a task poll (a pooler, nowhere to LISTEN)
        self._identity: DictRow | None = None  # pg_joined.IDENTITY of this database, once read
        self.flow_sight = FlowSight()
        # False: every idle worker a notification wakes claims, as before wake slots
        # (``pgwait.wait_woken``); for a benchmark's baseline in the same run.
        self.wake_slots = True

    # --- statements --------------------------------------------------------------------

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[PostgresTransaction]:
        with self.pool.transaction() as conn:
            if not durable:
                conn.execute("SET LOCAL synchronous_commit = off")
            yield PostgresTransaction(conn)

    @contextmanager
    def joined(self, connection: object) -> Iterator[PostgresTransaction]:
        if self._identity is None:
            self._identity = self.pool.fetch_one(pg_joined.IDENTITY, {})
        assert self._identity is not None
        rows = pg_joined.checked(connection, self._identity, self.pool.where)
        try:
            yield JoinedPostgresTransaction(rows)  # type: ignore[arg-type]  # a Connection's execute
        except psycopg.DataError as exc:
            raise InvalidArgument(f"{self.pool.where} refused a value: {type(exc).__name__}: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"{self.pool.where}, on the caller's connection: {type(exc).__name__}: {exc}"
            ) from exc

    def one(self, name: str, params: Mapping[str, Any]) -> DictRow | None:
        return self.pool.fetch_one(Q[name], params)

    def all(self, name: str, params: Mapping[str, Any]) -> list[DictRow]:
        return self.pool.fetch_all(Q[name], params)

    def execute(self, name: str, params: Mapping[str, Any]) -> None:
        self.pool.execute(Q[name], params)

    def event(self, tx: Transaction, event: Event) -> None:
        assert isinstance(tx, PostgresTransaction)
        insert_event(tx.conn, event)

    def insert_tasks(self, tx: Transaction, rows: Sequence[Params], trace_context: str | None) -> list[Row]:
        """Query ``insert_tasks_bulk``: the tasks and their events, one JSON array, in one
        statement."""
        given = []
        for row in rows:
            task = {column: row[column] for column in (*BULK_TASK_COLUMNS, "detail")}
            if row["not_before"] is not None:
                task["not_before"] = row["not_before"].isoformat()
            given.append(task)
        tasks = json.dumps(given, ensure_ascii=False)
        return list(tx.all("insert_tasks_bulk", {"tasks": tasks, "trace_context": trace_context}))

    def notify(self, tx: Transaction, count: int = 1) -> None:
        tx.count("notify_work", {"count": count})

    # --- values ----------------------------------------------------------------------

    def time(self, value: Any) -> datetime:
        return utc(value)

    def db_time(self, value: datetime) -> datetime:
        return value

    def duration(self, value: Any) -> timedelta:
        return timedelta(seconds=float(value))

    def db_duration(self, value: timedelta) -> float:
        return value.total_seconds()

    def json_in(self, kind: str, text: str | None) -> str | None:
        return jsonb(kind, text)

    def json_out(self, text: str | None) -> str | None:
        return canonical(text)

    def free_text(self, text: str) -> str:
        return free_text(text)

    def detail(self, value: Any) -> dict[str, Any]:
        detail: dict[str, Any] = value  # JSONB: psycopg has decoded it
        return detail

    def db_ids(self, ids: Sequence[str]) -> list[str]:
        return list(ids)

    # --- transitions and the claim ----------------------------------------------------

    def fenced(
        self, tx: Transaction | None, name: str, params: Params, journal: Sequence[JournalRow]
    ) -> Row | None:
        """One statement: the fenced query, and the journal rows as CTEs that write only
        when it matched."""
        if journal:
            name, params = fenced_statement(name, event=False, journal=True), params | journal_params(journal)
        if tx is None:
            return self.one(name, params)
        return tx.one(name, params)

    def transition(self, change: FencedTransition) -> DictRow:
        """One fenced UPDATE with its history event, journal rows (and NOTIFY) in one
        statement: one round trip, and the event and rows are written exactly when the
        update matched."""
        params = transition_params(change)
        journal = bool(change.journal)
        query = Q[fenced_statement(change.name, event=True, notify=change.notify, journal=journal)]
        row = self.pool.fetch_one(query, params)
        if row is None:
            refusals.refuse_transition(self.one, change.name, change.lease, change.event, params)
        return row

    def complete_all(
        self, completions: Sequence[FencedTransition], request: ClaimRequest | None
    ) -> BatchCompleted:
        """Pipelined: BEGIN, the completions and the claim go out together. One
        completion is its own fenced statement; several are query ``complete_batch``,
        one statement for all. A completion that matched no row is asked why in the same
        transaction, and when none matched, raising before COMMIT rolls the claim back."""
        if any(c.name != "complete" for c in completions):
            raise ValueError(f"complete_all takes completions only, got {[c.name for c in completions]}")
        return self._retrying_unflowed(lambda: self._complete_all(completions, request))

    def _complete_all(
        self, completions: Sequence[FencedTransition], request: ClaimRequest | None
    ) -> BatchCompleted:
        refused: dict[str, CancelPending | LeaseLostError] = {}
        try:
            with self.pool.pipelined_transaction() as conn:
                if len(completions) == 1:
                    (only,) = completions
                    query = Q[fenced_statement(only.name, event=True, journal=bool(only.journal))]
                    sent = conn.execute(query, transition_params(only))
                else:
                    conn.execute(Q["use_generic_plans"])
                    sent = conn.execute(Q["complete_batch"], batch_params(completions))
                claimed = [] if request is None else claim_in(conn, request, self, self.flow_sight)
                done = {row["task_id"] for row in sent.fetchall()}
                for change in completions:
                    if change.lease.task_id not in done:
                        refused[change.lease.task_id] = refusals.transition_refusal(
                            lambda name, p: conn.execute(Q[name], p).fetchone(),
                            change.name,
                            change.lease,
                            change.event,
                            transition_params(change),
                        )
                if len(refused) == len(completions):
                    raise _NothingCompleted
        except _NothingCompleted:
            return BatchCompleted(refused, [])
        return BatchCompleted(refused, claimed)

    def claim(self, request: ClaimRequest) -> list[ClaimedTask]:
        # Pipelined: BEGIN, the tenant locks and the claim (with its events) go out
        # together, and the claim statement still runs after the locks are held.
        def attempt() -> list[ClaimedTask]:
            with self.pool.pipelined_transaction() as conn:
                return claim_in(conn, request, self, self.flow_sight)

        return self._retrying_unflowed(attempt)

    def _retrying_unflowed(self, attempt: Callable[[], T]) -> T:
        """``attempt`` (a transaction with a claim), made again once if its claim went
        without flow control and found a limit set (rolled back: nothing of it stays);
        the second is sent with flow control."""
        try:
            return attempt()
        except FlowLimitsAppeared:
            return attempt()

    def signal_pending_after_suspend(self, tx: Transaction, task_id: str, name: str, at: Any) -> bool:
        """A delivery that held the row lock while the suspend waited for it committed
        after the suspend's snapshot (READ COMMITTED); this new statement sees it."""
        return bool(tx.count("wake_if_signal_pending", {"task_id": task_id, "name": name, "now": at}))

    # --- waiting, migrations, closing ---------------------------------------------------

    def wait_for_work(self, timeout_s: float, routes: Routes | None = None) -> bool:
        """Sleep until a notification on ``runifold_tasks`` or the earliest due time (a
        timer, a backoff, a lease expiry) of the tasks ``routes`` can claim (None: of any
        task), whichever comes first; behind a transaction pooler without a direct
        connection, look every ``POLL_INTERVAL_S`` instead."""
        if self.listener is not None:
            return self.listener.wait(lambda: self._due_in(routes), timeout_s)
        if self.pooled:
            return wait_until_due(lambda: self._due_in(routes), poll, timeout_s)
        with self.pool.connection(longer_by_s=timeout_s) as conn:
            conn.execute(Q["release_wake_slots"])  # its slot of an earlier wake was used
            conn.execute(Q["listen_work"])  # before looking, so no notification is missed
            try:
                if not self.wake_slots:
                    return wait_until_due(
                        lambda: _due_in(conn, routes), lambda s: notified(conn, s), timeout_s
                    )
                return wait_woken(conn, lambda: _due_in(conn, routes), timeout_s)
            finally:
                conn.execute(Q["unlisten_work"])

    @contextmanager
    def watch(self, task_id: str) -> Iterator[Watch]:
        """A watch on the store's one LISTEN connection for task ends and events
        (``pglisten``), the task marked awaited once it listens, since its end is
        notified only then; behind a transaction pooler with nowhere to LISTEN, polling
        every ``POLL_INTERVAL_S``."""
        if self.results is None:
            yield PollWatch(POLL_INTERVAL_S)
            return
        with self.results.watch(task_id) as watch:
            self.pool.execute(Q["await_result"], {"task_id": task_id})
            yield watch

    def pool_waits(self) -> PoolWaits:
        return self.pool.pool_waits()

    def bound_by_lease(self, lease_s: float) -> None:
        self.pool.bound_by_lease(lease_s)

    def _due_in(self, routes: Routes | None) -> float | None:
        with self.pool.connection() as conn:
            return _due_in(conn, routes)

    def migrate(self) -> int:
        """Apply pending numbered migrations under an advisory lock, so workers starting
        at once migrate one after another."""
        with self.pool.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS runifold_schema "
                "(version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            )
            row = conn.execute("SELECT COALESCE(MAX(version), 0) AS version FROM runifold_schema").fetchone()
            current = 0 if row is None else int(row["version"])
            latest, pending = pending_migrations("postgres", current, self.pool.where)
            for version, script in pending:
                conn.execute(script)  # several statements: no parameters, simple protocol
                conn.execute("INSERT INTO runifold_schema (version) VALUES (%s)", (version,))
        return latest

    def close(self) -> None:
        if self.listener is not None:
            self.listener.close()
        if self.results is not None:
            self.results.close()
        self.pool.close()


def _due_in(conn: Connection, routes: Routes | None) -> float | None:
    if routes is None:
        row = conn.execute(Q["seconds_until_due"]).fetchone()
    else:
        row = conn.execute(Q["seconds_until_routed_due"], route_params(routes)).fetchone()
    return None if row is None else row["due_in_s"]


class PostgresWorkflowStore(WorkflowStore):
    """The store on a PostgreSQL database; open it with :meth:`connect`."""

    dialect: PostgresDialect

    def __init__(
        self,
        pool: ProcessPool,
        *,
        target: PostgresTarget | None = None,
        max_pending_signals: int = checks.MAX_PENDING_SIGNALS,
    ) -> None:
        listener = results = None
        if target is not None and target.listen_conninfo is not None:
            direct = with_network_params(target.listen_conninfo)
            listener = DirectListener(direct, _CHANNEL, describe(target.listen_conninfo))
        if target is not None and not target.polls:
            listen_at = target.listen_conninfo or target.conninfo
            results = ResultListener(with_network_params(listen_at), describe(listen_at))
        dialect = PostgresDialect(
            pool, pooled=target is not None and target.pgbouncer, listener=listener, results=results
        )
        super().__init__(dialect, max_pending_signals=max_pending_signals)

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        connect_timeout: timedelta = timedelta(seconds=10),
        pool_timeout: timedelta = timedelta(seconds=30),
        migrate: bool = True,
        max_pending_signals: int = checks.MAX_PENDING_SIGNALS,
    ) -> PostgresWorkflowStore:
        """Open a connection pool on ``url`` (a ``postgresql://`` URL or a libpq conninfo;
        a URL may say a transaction pooler is in the path, see ``pgurl``) in this process
        and migrate the schema. ``connect_timeout`` bounds the wait for
        the first connections, ``pool_timeout`` the wait for a free one later;
        ``max_pending_signals`` caps the signals a task keeps unconsumed."""
        validate.count("max_pending_signals", max_pending_signals)
        if not isinstance(url, str) or not url:
            validate.refuse("PostgreSQL URL", "a non-empty string", url)
        target = parse_target(url)
        pool = ProcessPool.open(
            target.conninfo,
            min_size=min_size,
            max_size=max_size,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
            pgbouncer=target.pgbouncer,
        )
        if target.polls:
            _say_polling_once(pool.where)
        store = cls(pool, target=target, max_pending_signals=max_pending_signals)
        if migrate:
            try:
                store.migrate()
            except BaseException:
                store.close()
                raise
        return store


_said_polling: set[str] = set()


def _say_polling_once(where: str) -> None:
    """Once per process and database: without LISTEN a new task waits up to the interval."""
    if where not in _said_polling:
        _said_polling.add(where)
        log.info(
            "%s is behind a transaction pooler (pgbouncer=true) and the URL names no direct "
            "connection (listen_host/listen_port): idle workers look for work every %.1f s",
            where,
            POLL_INTERVAL_S,
        )
