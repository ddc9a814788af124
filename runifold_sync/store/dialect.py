"""What the store (:class:`~runifold_sync.store.base.WorkflowStore`) needs from a
database: the interface each backend implements, so every store operation is written
once above it.

- A :class:`Transaction` runs named queries (``sql/<dialect>.sql``) inside one
  transaction and knows the store time it runs at.
- :class:`Values` converts between Python values and the dialect's column values
  (SQLite keeps times and durations as integer microseconds and JSON as text; PostgreSQL
  has ``timestamptz``, intervals and JSONB, which cannot hold NUL and reorders keys).
- :class:`Dialect` adds autocommit statements, history events, NOTIFY, the fenced
  transitions and the claim (where the two backends differ most for speed), waiting for
  work, watching one task for ``wait_for_task`` and ``get_event``, migrations and
  connections. Driver errors leave a dialect as
  :class:`~runifold_sync.errors.StoreUnavailable`, use from a forked child as
  :class:`~runifold_sync.errors.StoreUsedAcrossFork`.

Every statement that changes a task row returns the store time it ran at as ``at``: its
history event is stamped with that instant.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any, Protocol

import attrs

from ..model.checkpoint import JournalRow
from .outage import OutageLog
from .records import BatchCompleted, ClaimedTask, ClaimRequest, Lease, Routes
from .timing import PoolWaits
from .watch import Watch

Params = dict[str, Any]  # a named query's parameters
Detail = dict[str, Any]  # a history event's detail (``event_details``)


@attrs.frozen
class Event:
    """A history event to append: ``at`` is store time as the dialect stores it, and a
    worker's event names the worker and the fencing token it wrote under."""

    task_id: str
    at: Any
    kind: str
    detail: Detail
    worker_id: str | None = None
    token: int | None = None


# The fenced transitions that end a task. Each returns the task's ``parent_id``, and in the
# same transaction wakes the parent if it waits for this task (query ``wake_parent``).
ENDING_TRANSITIONS = frozenset({"complete", "fail", "acknowledge_cancel"})
# What each task of a bulk insert (``Dialect.insert_tasks``) carries, in its dialect's
# JSON array's order: the parameters of query insert_task a task without flow options has.
BULK_TASK_COLUMNS = (
    "task_id",
    "definition_name",
    "definition_version",
    "tenant",
    "input",
    "priority",
    "not_before",
    "parent_id",
    "queue",
    "detached",
    "concurrency_key",
)


@attrs.frozen
class FencedTransition:
    """A worker's fenced state change: query ``name`` under ``lease`` with ``params``,
    its history event ``event`` (with ``detail``) and its ``journal`` rows, all in one
    transaction. ``notify`` wakes idle workers (the task is claimable again)."""

    name: str
    lease: Lease
    params: Params
    event: str
    detail: Detail = attrs.Factory(dict)
    notify: bool = False
    journal: Sequence[JournalRow] = ()


class Row(Protocol):
    """A result row addressable by column name (``sqlite3.Row`` or a dict)."""

    def __getitem__(self, key: str, /) -> Any: ...


class Transaction(Protocol):
    """Named queries run inside one open transaction."""

    def one(self, name: str, params: Mapping[str, Any]) -> Row | None:
        """The first row of query ``name``, None when it returns none."""

    def all(self, name: str, params: Mapping[str, Any]) -> Sequence[Row]: ...

    def count(self, name: str, params: Mapping[str, Any]) -> int:
        """Run query ``name``; returns how many rows it changed."""

    def now(self) -> Any:
        """Store time as a column value, the same on every call in this transaction."""

    def connection(self) -> Any:
        """The driver connection the transaction runs on, for a ``@workflow.transaction()``
        body's own statements."""


class Values(Protocol):
    """Conversions between Python values and one dialect's column values."""

    def time(self, value: Any) -> datetime:
        """A stored timestamp as an aware UTC datetime."""

    def db_time(self, value: datetime) -> Any: ...

    def duration(self, value: Any) -> timedelta:
        """A stored duration (as a query returns it) as a timedelta."""

    def db_duration(self, value: timedelta) -> Any: ...

    def json_in(self, kind: str, text: str | None) -> str | None:
        """JSON text to store, refused with InvalidArgument where the column cannot
        hold it (``kind`` names it in the message)."""

    def json_out(self, text: str | None) -> str | None:
        """JSON text read back, in the canonical encoding runifold_sync writes."""

    def free_text(self, text: str) -> str:
        """Free text (reasons, notes) in a form the database can store."""

    def detail(self, value: Any) -> dict[str, Any]:
        """A history event's stored detail as a dict."""

    def db_ids(self, ids: Sequence[str]) -> Any:
        """Task ids as one query parameter, for a statement about many tasks at once
        (a JSON array that ``json_each`` reads on SQLite, a ``text[]`` on PostgreSQL)."""


class Dialect(Values, abc.ABC):
    """One backend's database access and value adapters; see the module docstring.
    ``outage`` says in the log when the database stops and starts answering."""

    outage: OutageLog
    # The named queries that delete a batch of pruned tasks (parameter ``ids``) with every
    # row of theirs, the task rows last: the last one's count is the batch's.
    prune_queries: tuple[str, ...]

    @abc.abstractmethod
    def transaction(self, *, durable: bool = True) -> AbstractContextManager[Transaction]:
        """One write transaction, committed when the block ends without an error. With
        ``durable=False`` its commit does not wait for the disk: it becomes durable with
        the next commit that does (both logs are written in order), and a crash of the
        database before that loses it. Only for a write that a later durable commit of
        the same database depends on and that is made again if that one never happens."""

    @abc.abstractmethod
    def one(self, name: str, params: Mapping[str, Any]) -> Row | None:
        """Query ``name`` alone, its own transaction (autocommit); its first row."""

    @abc.abstractmethod
    def all(self, name: str, params: Mapping[str, Any]) -> Sequence[Row]: ...

    @abc.abstractmethod
    def execute(self, name: str, params: Mapping[str, Any]) -> None: ...

    @abc.abstractmethod
    def event(self, tx: Transaction, event: Event) -> None:
        """Append ``event`` to the history inside ``tx``."""

    @abc.abstractmethod
    def insert_tasks(self, tx: Transaction, rows: Sequence[Params], trace_context: str | None) -> list[Row]:
        """Insert new tasks, each of ``rows`` the parameters of query ``insert_task`` for
        a task without flow options plus its ``enqueued`` event's ``detail``, and their
        events, inside ``tx``: one statement for the batch where the dialect can (a
        producer's batch is bound by round trips and statements sent, not by rows).
        Returns ``task_id`` and ``at`` of each task inserted; a task whose id is stored
        already is left out, for the caller to answer one by one."""

    @abc.abstractmethod
    def notify(self, tx: Transaction, count: int = 1) -> None:
        """Wake idle workers when ``tx`` commits, about ``count`` of them (the tasks it
        made claimable); nothing to do where they poll."""

    @abc.abstractmethod
    def joined(self, connection: object) -> AbstractContextManager[Transaction]:
        """The application's own open transaction on ``connection`` (a driver connection
        to this store's database) as a Transaction: checked to reach this database at
        this schema version (:class:`~runifold_sync.errors.InvalidArgument` otherwise),
        and never committed or rolled back here."""

    @abc.abstractmethod
    def fenced(
        self, tx: Transaction | None, name: str, params: Params, journal: Sequence[JournalRow]
    ) -> Row | None:
        """Fenced query ``name`` and, only if it matched its row, the ``journal`` rows of
        task ``params["task_id"]`` (written, or deleted where ``entry_json`` is None):
        atomically, inside ``tx`` or (``tx`` None) on their own. None when no row matched."""

    @abc.abstractmethod
    def transition(self, change: FencedTransition) -> Row:
        """Make ``change``; raises CancelPending or LeaseLostError when no row matched
        (``refusals.refuse_transition``)."""

    @abc.abstractmethod
    def complete_all(
        self, completions: Sequence[FencedTransition], request: ClaimRequest | None
    ) -> BatchCompleted:
        """The ``completions`` and then the claim ``request`` (if any), in one
        transaction: a completion refused (``refusals.transition_refusal``) writes
        nothing and the others still commit; when every one is refused the claim is not
        made."""

    @abc.abstractmethod
    def claim(self, request: ClaimRequest) -> list[ClaimedTask]: ...

    @abc.abstractmethod
    def signal_pending_after_suspend(self, tx: Transaction, task_id: str, name: str, at: Any) -> bool:
        """After a suspend for signal ``name`` in ``tx``: wake the task if a delivery the
        suspend's statement could not see is pending; True when it woke."""

    @abc.abstractmethod
    def wait_for_work(self, timeout_s: float, routes: Routes | None = None) -> bool:
        """True once a task ``routes`` can claim (None: any task) is due, False after
        ``timeout_s``."""

    @abc.abstractmethod
    def watch(self, task_id: str) -> AbstractContextManager[Watch]:
        """A subscription to changes of task ``task_id`` (its end, its events), made
        before the caller first reads the task (see ``watch``)."""

    def bound_by_lease(self, lease_s: float) -> None:
        """A worker holding leases of ``lease_s`` uses this store (``bound_calls``);
        nothing to do where no call can block on a network."""

    @abc.abstractmethod
    def pool_waits(self) -> PoolWaits:
        """The requests for a connection (or the database lock) since the last call and
        their waits; the count starts again."""

    @abc.abstractmethod
    def migrate(self) -> int: ...

    @abc.abstractmethod
    def close(self) -> None: ...
