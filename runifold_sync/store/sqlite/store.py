"""SQLite store: the embedded default for one machine.

Each thread gets its own connection (the heartbeat thread never shares the step thread's
connection), each connection remembers the pid that opened it, and every multi-statement
write starts with ``BEGIN IMMEDIATE`` so two processes can never both read a task as
claimable; store time (the host's boot clock from an anchor in the database, see
``sqlite_clock``) is read once per write transaction. WAL with ``synchronous=FULL``
keeps a commit durable across power loss, which the ambiguous-effect promise relies on.
Waiting for the database lock is done by the connection (``sqlite_connection``), in
short random pauses up to the busy timeout, so processes sharing a file share the work.

Only what differs from PostgreSQL is here: connections, store time, the claim, waiting
for work and watching a task (SQLite has no notifications: it polls its change counter)
and migrations. The operations are the
:class:`~runifold_sync.store.base.WorkflowStore`'s, written once.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ...errors import CancelPending, InvalidArgument, LeaseLostError, StoreClosed, StoreUsedAcrossFork
from ...model import validate
from ...model.checkpoint import JournalRow
from ...model.codec import c_encoder, storable_text
from .. import checks, event_details, refusals, row_records, sql_flow
from ..base import WorkflowStore
from ..dialect import (
    BULK_TASK_COLUMNS,
    ENDING_TRANSITIONS,
    Dialect,
    Event,
    FencedTransition,
    Params,
    Row,
    Transaction,
)
from ..outage import OutageLog
from ..queries import load_queries
from ..records import BatchCompleted, ClaimedTask, ClaimRequest, Routes
from ..timing import PoolWaits
from ..watch import CounterWatch
from . import clock as sqlite_clock
from . import joined as sqlite_joined
from . import schema as sqlite_schema
from .connection import (
    MICROSECOND,
    SqliteConnection,
    create_private,
    in_us,
    store_error,
    time_at,
)

_Q = load_queries("sqlite", sqlite_clock.NOW)
_BULK_INTEGERS = ("definition_version", "priority", "not_before")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SYNCHRONOUS = ("FULL", "EXTRA", "NORMAL")
# SQLite has no notifications: wait_for_work polls PRAGMA data_version (a read of shared
# memory that changes when another connection commits) at this interval, and asks for
# due work again only when it changed or a known due time passed; a watch of one task
# (wait_for_task, get_event) reads the task again only when it changed.
_WAIT_POLL_S = 0.005


def _write_journal(conn: sqlite3.Connection, task_id: str, journal: Sequence[JournalRow]) -> None:
    """Write (or delete, where ``entry_json`` is None) journal rows inside the caller's
    transaction."""
    places = [
        {"task_id": task_id, "journal": r.journal, "position": r.position, "entry": r.entry_json}
        for r in journal
    ]
    written = [place for place in places if place["entry"] is not None]
    if written:
        conn.executemany(_Q["write_journal_entry"], written)
    for place in places:
        if place["entry"] is None:
            conn.execute(_Q["drop_journal_entry"], place)


def _routes_json(routes: Routes) -> str:
    """``routes`` as the JSON array of [queue, name, version, fingerprint] the routed
    statements read with ``json_each``."""
    return json.dumps([[r.queue, r.name, r.version, r.fingerprint] for r in routes.routes])


# A history event's detail as json.dumps(detail, sort_keys=True) writes it, with one
# encoder rather than a new one per call: every claim and transition writes an event.
_detail_text = c_encoder(json.JSONEncoder(sort_keys=True))


class _Immediate:
    """One ``BEGIN IMMEDIATE`` transaction on this thread's connection, committed when the
    block succeeds and rolled back when it raises; a SQLite error becomes the store's
    error, a value SQLite cannot hold the caller's. With ``stamped`` the block gets a
    :class:`SqliteTransaction` at the store time read first, else the raw connection.
    A class rather than a generator: every claim and transition enters one, and a
    generator's context manager took five calls in and out where this takes one."""

    __slots__ = ("_dialect", "_what", "_stamped", "_raw", "_relaxed")

    def __init__(self, dialect: SqliteDialect, what: str, stamped: bool, durable: bool = True) -> None:
        self._dialect = dialect
        self._what = what
        self._stamped = stamped
        # Not durable: this transaction's commit does not sync the log (synchronous NORMAL
        # in WAL mode: consistent, and durable with the next commit that syncs the log),
        # set before it begins and the connection's own setting restored after it ends.
        self._relaxed = not durable and dialect.synchronous in ("FULL", "EXTRA")

    def __enter__(self) -> Any:
        locking = self._dialect._conn()
        raw = self._raw = locking.raw
        try:
            if self._relaxed:  # SQLite takes it only outside a transaction
                raw.execute("PRAGMA synchronous=NORMAL")
            locking.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            if self._relaxed:
                self._restore_synchronous()
            raise self._failed(exc) from exc
        if not self._stamped:
            return raw
        try:
            return SqliteTransaction(raw, raw.execute(_Q["now"]).fetchone()[0])
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)  # rolls back; raises a store error
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            self._raw.execute("COMMIT" if kind is None else "ROLLBACK")
        except sqlite3.Error as error:
            raise self._failed(error) from error
        except OverflowError as error:
            raise self._refused(error) from error
        finally:
            if self._relaxed:
                self._restore_synchronous()
        if isinstance(exc, sqlite3.Error):
            raise self._failed(exc) from exc
        if isinstance(exc, OverflowError):  # a value SQLite cannot hold: the caller's, not an outage
            raise self._refused(exc) from exc

    def _restore_synchronous(self) -> None:
        """The connection's own log syncing back, for every transaction after this one; a
        connection that cannot have it back is closed, so none commits unsynced unasked."""
        try:
            self._raw.execute(f"PRAGMA synchronous={self._dialect.synchronous}")
        except sqlite3.Error as error:
            self._dialect.discard_connection()
            raise self._failed(error) from error

    def _failed(self, exc: sqlite3.Error) -> Exception:
        path = self._dialect.path
        return store_error(f"{self._what} {path!r} failed", path, exc)

    def _refused(self, exc: OverflowError) -> Exception:
        return InvalidArgument(f"{self._what} {self._dialect.path!r} refused a value: {exc}")


class SqliteTransaction:
    """A ``BEGIN IMMEDIATE`` transaction at store time ``at``, which every query in it
    receives as ``:now``."""

    __slots__ = ("at", "raw")

    def __init__(self, raw: sqlite3.Connection, at: int) -> None:
        self.raw = raw
        self.at = at

    def one(self, name: str, params: Mapping[str, Any]) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.raw.execute(_Q[name], {"now": self.at, **params}).fetchone()
        return row

    def all(self, name: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        return self.raw.execute(_Q[name], {"now": self.at, **params}).fetchall()

    def count(self, name: str, params: Mapping[str, Any]) -> int:
        return self.raw.execute(_Q[name], {"now": self.at, **params}).rowcount

    def now(self) -> int:
        return self.at

    def connection(self) -> sqlite3.Connection:
        return self.raw


class JoinedTransaction(SqliteTransaction):
    """The application's own transaction (``enqueue(..., connection=)``): rows by column
    name whatever ``row_factory`` it set, and never committed here."""

    __slots__ = ()

    def _run(self, name: str, params: Mapping[str, Any]) -> sqlite3.Cursor:
        cursor = self.raw.cursor()
        cursor.row_factory = sqlite3.Row
        return cursor.execute(_Q[name], {"now": self.at, **params})

    def one(self, name: str, params: Mapping[str, Any]) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self._run(name, params).fetchone()
        return row

    def all(self, name: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        return self._run(name, params).fetchall()

    def count(self, name: str, params: Mapping[str, Any]) -> int:
        return self._run(name, params).rowcount


class SqliteDialect(Dialect):
    """Thread-local connections to one file, bound to the process that opened them."""

    prune_queries = (
        "prune_events",
        "prune_journal",
        "prune_signals",
        "prune_resolutions",
        "prune_task_events",
        "prune_task_attributes",
        "prune_task_streams",
        "prune_tasks",
    )

    def __init__(self, path: str, synchronous: str, busy_timeout_s: float) -> None:
        self.path = path
        self.outage = OutageLog(f"SQLite database {path!r}")
        self.synchronous = synchronous.upper()
        self._busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self.connections: list[SqliteConnection] = []  # every one opened, one per thread
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False
        self._routes_known: tuple[Routes, str] | None = None  # see _routes_text

    def _routes_text(self, routes: Routes) -> str:
        """``_routes_json(routes)``, kept for the routes last asked for: a worker claims
        with one Routes until its registry changes, and claims at every task."""
        known = self._routes_known
        if known is None or known[0] is not routes:
            known = self._routes_known = (routes, _routes_json(routes))
        return known[1]

    # --- connections and statements ------------------------------------------------

    def _conn(self) -> SqliteConnection:
        if self._closed:
            raise StoreClosed(f"store {self.path!r} is closed")
        try:
            conn: SqliteConnection = self._local.conn
        except AttributeError:  # this thread's first statement
            conn = self._connect()
        if conn.pid != os.getpid():
            conn.check_pid()  # raises StoreUsedAcrossFork
        return conn

    def _connect(self) -> SqliteConnection:
        """This thread's connection, opened."""
        if self._pid != os.getpid():  # a new thread of a forked child
            raise StoreUsedAcrossFork(
                f"store {self.path!r} was opened in process {self._pid} and cannot be "
                f"used in forked process {os.getpid()}; open a new store after fork"
            )
        try:
            conn = SqliteConnection(self.path, self.synchronous, self._busy_timeout_s)
        except sqlite3.Error as exc:
            raise store_error(f"cannot open SQLite database {self.path!r}", self.path, exc) from exc
        self._local.conn = conn
        with self._lock:
            self.connections.append(conn)
        return conn

    def discard_connection(self) -> None:
        """Close this thread's connection; its next statement opens a new one."""
        conn: SqliteConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            return
        del self._local.conn
        with self._lock:
            if conn in self.connections:
                self.connections.remove(conn)
        conn.raw.close()

    def _immediate(self, what: str) -> AbstractContextManager[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction, committed when the block succeeds."""
        return _Immediate(self, what, stamped=False)

    def transaction(self, *, durable: bool = True) -> AbstractContextManager[SqliteTransaction]:
        return _Immediate(self, "SQLite write to", stamped=True, durable=durable)

    @contextmanager
    def joined(self, connection: object) -> Iterator[SqliteTransaction]:
        raw = sqlite_joined.checked(self.path, connection)
        try:
            yield JoinedTransaction(raw, raw.execute(_Q["now"]).fetchone()[0])
        except sqlite3.Error as exc:
            raise store_error(
                f"SQLite write on the caller's connection to {self.path!r}", self.path, exc
            ) from exc

    def all(self, name: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        """One statement in autocommit mode: its own atomic transaction. Every row is
        fetched, which ends the statement (and its write lock) at once."""
        conn = self._conn()
        try:
            return conn.execute(_Q[name], params).fetchall()
        except (sqlite3.Error, OverflowError) as exc:
            raise self._query_error(name, exc) from exc

    def one(self, name: str, params: Mapping[str, Any]) -> sqlite3.Row | None:
        """:meth:`all`'s first row: written out rather than through :meth:`all`, since a
        step's commit is one such statement."""
        conn = self._conn()
        try:
            found = conn.execute(_Q[name], params).fetchall()
        except (sqlite3.Error, OverflowError) as exc:
            raise self._query_error(name, exc) from exc
        return found[0] if found else None

    def _query_error(self, name: str, exc: sqlite3.Error | OverflowError) -> Exception:
        """What a failed autocommit statement raises: the store's error for a SQLite
        error, the caller's for a value SQLite cannot hold (not an outage)."""
        if isinstance(exc, OverflowError):
            return InvalidArgument(f"SQLite query {name} on {self.path!r} refused a value: {exc}")
        return store_error(f"SQLite query {name} on {self.path!r} failed", self.path, exc)

    def execute(self, name: str, params: Mapping[str, Any]) -> None:
        self.all(name, params)

    def event(self, tx: Transaction, event: Event) -> None:
        tx.count(
            "insert_event",
            {
                "task_id": event.task_id,
                "now": event.at,
                "kind": event.kind,
                "worker_id": event.worker_id,
                "token": event.token,
                "detail": _detail_text(event.detail),
            },
        )

    def insert_tasks(self, tx: Transaction, rows: Sequence[Params], trace_context: str | None) -> list[Row]:
        """Query ``insert_tasks_bulk`` with the tasks as one JSON array, then the new
        ones' events (``insert_enqueued_events``): two statements a batch."""
        for row in rows:  # bound one by one, sqlite3 refused these; json_extract would store a REAL
            for column in _BULK_INTEGERS:
                if row[column] is not None and not _INT64_MIN <= row[column] <= _INT64_MAX:
                    raise OverflowError(f"{column} {row[column]} does not fit a SQLite INTEGER")
        tasks = json.dumps(
            [[row[column] for column in BULK_TASK_COLUMNS] for row in rows], ensure_ascii=False
        )
        inserted: list[Row] = list(
            tx.all("insert_tasks_bulk", {"tasks": tasks, "trace_context": trace_context})
        )
        if inserted:
            stamped = {row["task_id"]: row["at"] for row in inserted}
            events = [
                [row["task_id"], json.dumps(row["detail"], sort_keys=True), stamped[row["task_id"]]]
                for row in rows
                if row["task_id"] in stamped
            ]
            tx.count("insert_enqueued_events", {"events": json.dumps(events)})
        return inserted

    def notify(self, tx: Transaction, count: int = 1) -> None:
        """Idle workers poll (see ``wait_for_work``): nothing to send."""

    # --- values ----------------------------------------------------------------------

    def time(self, value: Any) -> datetime:
        return time_at(value)

    def db_time(self, value: datetime) -> int:
        return in_us(value)

    def duration(self, value: Any) -> timedelta:
        return MICROSECOND * int(value)

    def db_duration(self, value: timedelta) -> int:
        return in_us(value)

    def json_in(self, kind: str, text: str | None) -> str | None:
        return text

    def json_out(self, text: str | None) -> str | None:
        return text

    def free_text(self, text: str) -> str:
        return storable_text(text)

    def detail(self, value: Any) -> dict[str, Any]:
        detail: dict[str, Any] = json.loads(value)
        return detail

    def db_ids(self, ids: Sequence[str]) -> str:
        return json.dumps(list(ids))

    # --- transitions and the claim ----------------------------------------------------

    def fenced(
        self, tx: Transaction | None, name: str, params: Params, journal: Sequence[JournalRow]
    ) -> Row | None:
        if tx is not None:
            assert isinstance(tx, SqliteTransaction)
            row: Row | None = tx.one(name, params)
            if row is not None:
                _write_journal(tx.raw, params["task_id"], journal)
            return row
        if not journal:  # one statement: autocommit is its own transaction
            return self.one(name, params)
        # A step's commit: the fenced UPDATE and its rows, and no store-time read of its own.
        with self._immediate("SQLite checkpoint commit to") as conn:
            row = conn.execute(_Q[name], params).fetchone()
            if row is not None:
                _write_journal(conn, params["task_id"], journal)
            return row

    def transition(self, change: FencedTransition) -> Row:
        with self.transaction() as tx:
            return self._transition_in(tx, change)

    def complete_all(
        self, completions: Sequence[FencedTransition], request: ClaimRequest | None
    ) -> BatchCompleted:
        refused: dict[str, CancelPending | LeaseLostError] = {}
        with self.transaction() as tx:
            for completion in completions:
                try:
                    self._transition_in(tx, completion)
                except (CancelPending, LeaseLostError) as refusal:  # it wrote nothing
                    refused[completion.lease.task_id] = refusal
            if request is None or len(refused) == len(completions):
                return BatchCompleted(refused, [])
            return BatchCompleted(refused, self._claim_in(tx, request))

    def _transition_in(self, tx: SqliteTransaction, change: FencedTransition) -> Row:
        """A fenced UPDATE, its journal rows and its history event, inside ``tx``."""
        lease = change.lease
        params = change.params | {"task_id": lease.task_id, "token": lease.fencing_token}
        row = self.fenced(tx, change.name, params, change.journal)
        if row is None:
            refusals.refuse_transition(tx.one, change.name, lease, change.event, params)
        if change.name in ENDING_TRANSITIONS and row["parent_id"] is not None:
            tx.one("wake_parent", {"task_id": lease.task_id, "parent_id": row["parent_id"], "now": tx.at})
        event = Event(lease.task_id, tx.at, change.event, change.detail, lease.worker_id, lease.fencing_token)
        self.event(tx, event)
        return row

    def claim(self, request: ClaimRequest) -> list[ClaimedTask]:
        with self.transaction() as tx:
            return self._claim_in(tx, request)

    def _claim_in(self, tx: SqliteTransaction, request: ClaimRequest) -> list[ClaimedTask]:
        """The claim, inside ``tx`` (a bad limit rolls it back): candidates in claim
        order, then each one leased and its history event written."""
        limit = validate.integer("claim limit", request.limit, minimum=1, maximum=checks.MAX_CLAIM_LIMIT)
        conn, now = tx.raw, tx.at
        worker_id = request.worker_id.value
        claimed = []
        # Without a flow limit set, the claim without its flow-control parts.
        variant = "" if conn.execute(_Q["flow_limits_set"]).fetchone()[0] else "@unflowed"
        if request.routes is None:
            query = _Q["claimable_tasks" + variant]
            candidates = conn.execute(query, {"now": now, "limit": limit}).fetchall()
        else:
            params = {"now": now, "limit": limit, "routes": self._routes_text(request.routes)}
            candidates = conn.execute(_Q["claimable_routed_tasks" + variant], params).fetchall()
        for tenant in sorted({c["tenant"] for c in candidates}):
            conn.execute(_Q["mark_tenant_served"], {"tenant": tenant, "now": now})
        lease_us = in_us(request.lease.value)
        prune = False
        for candidate in candidates:
            row = conn.execute(
                _Q["lease_task"],
                {
                    "task_id": candidate["task_id"],
                    "worker_id": worker_id,
                    "now": now,
                    "lease": lease_us,
                    "fingerprint": candidate["route_fingerprint"],
                },
            ).fetchone()
            detail = event_details.claimed(candidate["state"], candidate["worker_id"])
            self.event(tx, Event(row["task_id"], now, "claimed", detail, worker_id, row["fencing_token"]))
            for scope, name in sql_flow.rated_claims(candidate):
                params = {"scope": scope, "name": name, "now": now}
                prune |= conn.execute(_Q["record_flow_claim"], params).fetchone()["seq"] % 64 == 0
            resolutions = {}
            if row["resolved"]:  # rare: only tasks an operator resolved have any
                found = conn.execute(_Q["resolutions_for_task"], {"task_id": row["task_id"]})
                resolutions = row_records.effect_resolutions(found, self)
            timing = {
                "due_at": candidate["ready_at"],
                "at": now,
                "from_state": candidate["state"],
                "previous_updated_at": candidate["updated_at"],
                "previous_signal": candidate["waiting_for_signal"],
            }
            claimed.append(row_records.claimed_task(dict(row) | timing, worker_id, self, resolutions))
        if prune:  # every 64th claim of a group (query prune_flow_claims)
            conn.execute(_Q["prune_flow_claims"], {"now": now})
        return claimed

    def signal_pending_after_suspend(self, tx: Transaction, task_id: str, name: str, at: Any) -> bool:
        """Never: ``BEGIN IMMEDIATE`` serializes the suspend with every delivery, so the
        suspend's own statement saw each one that committed before it."""
        return False

    # --- waiting, migrations, closing ---------------------------------------------------

    def wait_for_work(self, timeout_s: float, routes: Routes | None = None) -> bool:
        """Poll until a task ``routes`` can claim (None: any task) is due; see
        ``_WAIT_POLL_S``."""
        deadline = time.monotonic() + timeout_s
        while True:
            version = self._data_version()
            if routes is None:
                row = self.one("seconds_until_due", {})
            else:
                row = self.one("seconds_until_routed_due", {"routes": self._routes_text(routes)})
            due_in_s = None if row is None else row["due_in_s"]
            if due_in_s is not None and due_in_s <= 0:
                return True
            due_by = None if due_in_s is None else time.monotonic() + due_in_s
            while True:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    return False
                time.sleep(min(remaining_s, _WAIT_POLL_S))
                if (due_by is not None and time.monotonic() >= due_by) or self._data_version() != version:
                    break

    @contextmanager
    def watch(self, task_id: str) -> Iterator[CounterWatch]:
        """Woken by ``PRAGMA data_version`` (see ``_WAIT_POLL_S``), read on this thread's
        connection, whose commits are the only ones it does not count: the thread is
        blocked waiting, so it makes none."""
        yield CounterWatch(self._data_version, _WAIT_POLL_S)

    def pool_waits(self) -> PoolWaits:
        """The waits for the database lock of every connection of this store, each
        connection's count started again (its own thread may add one as it is taken)."""
        with self._lock:
            conns = list(self.connections)
        total = PoolWaits()
        for conn in conns:
            taken, conn.waits = conn.waits, PoolWaits()
            total.requests += taken.requests
            total.waited += taken.waited
            total.wait_s += taken.wait_s
        return total

    def _data_version(self) -> int:
        """Changes whenever another connection commits to the database."""
        try:
            version: int = self._conn().execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise store_error(f"SQLite data_version on {self.path!r} failed", self.path, exc) from exc
        return version

    def migrate(self) -> int:
        """Bring the file to this release's schema (``sqlite_schema``): only read when it
        is there already, so opening a store takes no write lock then."""
        latest = sqlite_schema.current_version(self._conn().raw, self.path)
        if latest is not None:
            return latest
        with self._immediate("migrating") as conn:
            return sqlite_schema.migrate_in(conn, self.path)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self.connections = self.connections, []
        for conn in conns:
            if conn.pid == os.getpid():
                conn.raw.close()


class SqliteWorkflowStore(WorkflowStore):
    """The store on a SQLite file; open it with :meth:`open`."""

    dialect: SqliteDialect

    def __init__(
        self,
        path: str,
        *,
        synchronous: str,
        busy_timeout: timedelta,
        max_pending_signals: int = checks.MAX_PENDING_SIGNALS,
    ) -> None:
        self.path = path
        dialect = SqliteDialect(path, synchronous, busy_timeout.total_seconds())
        super().__init__(dialect, max_pending_signals=max_pending_signals)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout: timedelta = timedelta(seconds=30),
        max_pending_signals: int = checks.MAX_PENDING_SIGNALS,
    ) -> SqliteWorkflowStore:
        """Open (creating if needed) and migrate the database at ``path``.
        ``max_pending_signals`` caps the signals a task keeps unconsumed; more are refused."""
        text = os.fspath(path)
        if not text:
            raise InvalidArgument("SQLite path must not be empty")
        if synchronous.upper() not in _SYNCHRONOUS:
            validate.refuse("synchronous", f"one of {_SYNCHRONOUS}", synchronous)
        validate.duration("busy_timeout", busy_timeout)
        if text == ":memory:":
            # Each thread's own connection (a heartbeat's) would get its own empty database.
            raise InvalidArgument(
                "SQLite path ':memory:' is refused: the store needs a file, since every worker "
                "thread and process opens its own connection to it; in tests use a temporary file"
            )
        if not Path(text).parent.exists():
            raise InvalidArgument(f"directory of SQLite path {text!r} does not exist")
        create_private(text)
        store = cls(
            text,
            synchronous=synchronous.upper(),
            busy_timeout=busy_timeout,
            max_pending_signals=max_pending_signals,
        )
        store.migrate()
        return store
