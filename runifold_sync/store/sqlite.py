"""SQLite store: the embedded default for one machine.

Each thread gets its own connection (the heartbeat thread never shares the step thread's
connection), each connection remembers the pid that opened it, and every multi-statement
write starts with ``BEGIN IMMEDIATE`` so two processes can never both read a task as
claimable. WAL with ``synchronous=FULL`` keeps a commit durable across power loss, which
the ambiguous-effect promise relies on. Waiting for the database lock is done by the
connection (``sqlite_connection``), in short random pauses up to the busy timeout, so
processes sharing a file share the work.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ..admission import TenantAdmission, TenantPolicy
from ..errors import (
    InvalidArgument,
    InvalidState,
    LeaseLostError,
    SchemaTooNew,
    SignalConflict,
    StoreClosed,
    StoreUnavailable,
    TaskNotFound,
)
from ..models import LeaseDuration, TaskState, WorkerId, WorkflowTask
from . import rows
from .base import (
    ClaimedTask,
    ClaimRequest,
    Committed,
    EnqueueResult,
    Lease,
    QueueStats,
    Signal,
    SignalDelivery,
    TaskEvent,
    TaskRecord,
    VersionReference,
    WorkerRecord,
    WorkflowStore,
)
from .queries import load_migrations, load_queries
from .sqlite_connection import MICROSECOND, SqliteConnection, in_us, migration_statements, time_at

# Store time in integer microseconds: SQL time (millisecond resolution) plus the offset.
NOW = (
    "(CAST(ROUND((julianday('now') - 2440587.5) * 86400000000.0) AS INTEGER)"
    " + (SELECT offset_us FROM runifold_clock))"
)
_Q = load_queries("sqlite", NOW)
_SYNCHRONOUS = ("FULL", "EXTRA", "NORMAL")
# SQLite has no notifications: wait_for_work polls PRAGMA data_version (a read of shared
# memory that changes when another connection commits) at this interval, and asks for
# due work again only when it changed or a known due time passed.
_WAIT_POLL_S = 0.005


class SqliteWorkflowStore(WorkflowStore):
    def __init__(
        self,
        path: str,
        *,
        synchronous: str,
        busy_timeout: timedelta,
        max_pending_signals: int = rows.MAX_PENDING_SIGNALS,
    ) -> None:
        self.path = path
        self._max_pending_signals = rows.check_pending_cap(max_pending_signals)
        self._synchronous = synchronous
        self._busy_timeout_s = busy_timeout.total_seconds()
        self._local = threading.local()
        self._all: list[SqliteConnection] = []
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._closed = False

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        busy_timeout: timedelta = timedelta(seconds=30),
        max_pending_signals: int = rows.MAX_PENDING_SIGNALS,
    ) -> SqliteWorkflowStore:
        """Open (creating if needed) and migrate the database at ``path``.
        ``max_pending_signals`` caps the signals a task keeps unconsumed; more are refused."""
        text = os.fspath(path)
        if not text:
            raise InvalidArgument("SQLite path must not be empty")
        if synchronous.upper() not in _SYNCHRONOUS:
            raise InvalidArgument(f"synchronous must be one of {_SYNCHRONOUS}, got {synchronous!r}")
        if not isinstance(busy_timeout, timedelta) or busy_timeout < timedelta(0):
            raise InvalidArgument(f"busy_timeout must be a non-negative timedelta, got {busy_timeout!r}")
        if text != ":memory:" and not Path(text).parent.exists():
            raise InvalidArgument(f"directory of SQLite path {text!r} does not exist")
        store = cls(
            text,
            synchronous=synchronous.upper(),
            busy_timeout=busy_timeout,
            max_pending_signals=max_pending_signals,
        )
        store.migrate()
        return store

    # --- connections and transactions ----------------------------------------------

    def _conn(self) -> SqliteConnection:
        if self._closed:
            raise StoreClosed(f"store {self.path!r} is closed")
        conn: SqliteConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._pid != os.getpid():
                raise StoreUnavailable(
                    f"store {self.path!r} was opened in process {self._pid} and cannot be "
                    f"used in forked process {os.getpid()}; open a new store after fork"
                )
            try:
                conn = SqliteConnection(self.path, self._synchronous, self._busy_timeout_s)
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"cannot open SQLite database {self.path!r}: {exc}") from exc
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        conn.check_pid()
        return conn

    @contextmanager
    def _write(self) -> Iterator[tuple[sqlite3.Connection, int]]:
        """One ``BEGIN IMMEDIATE`` transaction and the store time it runs at."""
        locking = self._conn()
        try:
            locking.execute("BEGIN IMMEDIATE")
            conn = locking.raw
            try:
                now = conn.execute(_Q["now"]).fetchone()[0]
                yield conn, now
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite write to {self.path!r} failed: {exc}") from exc

    def _run(self, name: str, params: dict[str, Any]) -> list[sqlite3.Row]:
        """One statement in autocommit mode: its own atomic transaction."""
        conn = self._conn()
        try:
            return conn.execute(_Q[name], params).fetchall()
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite query {name} on {self.path!r} failed: {exc}") from exc

    def migrate(self) -> int:
        """Apply pending numbered migrations; returns the schema version."""
        migrations = load_migrations("sqlite")
        latest = migrations[-1][0]
        locking = self._conn()
        try:
            locking.execute("BEGIN IMMEDIATE")
            conn = locking.raw
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS runifold_schema "
                    "(version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
                )
                current = conn.execute("SELECT MAX(version) FROM runifold_schema").fetchone()[0] or 0
                if current > latest:
                    raise SchemaTooNew(
                        f"database {self.path!r} has schema version {current}; this "
                        f"runifold_sync knows up to {latest}. Upgrade runifold_sync."
                    )
                for version, script in migrations:
                    if version > current:
                        for statement in migration_statements(script):
                            conn.execute(statement)
                        conn.execute("INSERT INTO runifold_schema VALUES (?, datetime('now'))", (version,))
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"migrating {self.path!r} failed: {exc}") from exc
        return latest

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            if conn.pid == os.getpid():
                conn.raw.close()

    # --- producers and operators -------------------------------------------------

    def enqueue_many(self, tasks: list[WorkflowTask]) -> list[EnqueueResult]:
        rows.check_tasks(tasks)
        results = []
        with self._write() as (conn, now):
            for task in tasks:
                cursor = conn.execute(
                    _Q["insert_task"],
                    {
                        "task_id": task.task_id,
                        "definition_name": task.definition_name,
                        "definition_version": task.definition_version,
                        "tenant": task.tenant,
                        "input": task.input_json,
                        "priority": task.priority,
                        "not_before": None if task.not_before is None else in_us(task.not_before),
                        "now": now,
                    },
                )
                if cursor.rowcount == 1:
                    _event(conn, now, task.task_id, "enqueued", None, None, rows.enqueued_detail(task))
                    results.append(EnqueueResult(task.task_id, created=True))
                    continue
                row = conn.execute(_Q["select_task"], {"task_id": task.task_id}).fetchone()
                results.append(rows.already_enqueued(task, row))  # a conflict rolls the batch back
        return results

    def resolve_effect(
        self,
        task_id: str,
        effect_key: str,
        *,
        applied: bool,
        result_json: str | None,
        actor: str,
        reason: str,
    ) -> None:
        rows.check_resolution(applied, actor, reason)
        with self._write() as (conn, now):
            params = {"task_id": task_id, "effect_key": effect_key, "now": now}
            if conn.execute(_Q["requeue_resolved"], params).fetchone() is None:
                record = self._record(conn.execute(_Q["select_task"], params).fetchone(), task_id)
                raise rows.not_resolvable(record, effect_key)
            conn.execute(
                _Q["insert_resolution"],
                params | {"applied": applied, "result": result_json, "actor": actor, "reason": reason},
            )
            detail = rows.resolved_detail(effect_key, applied, actor, reason)
            _event(conn, now, task_id, "effect_resolved", None, None, detail)

    def send_signal(
        self,
        task_id: str,
        name: str,
        payload: Any,
        *,
        signal_id: str,
        sender: str,
        tenant: str = "default",
        reason: str | None = None,
    ) -> SignalDelivery:
        payload_text = rows.check_signal(name, signal_id, sender, tenant, reason, payload)
        refusal = None
        with self._write() as (conn, now):
            params = {"task_id": task_id, "signal_id": signal_id, "name": name, "now": now}
            task = conn.execute(_Q["lock_task"], params).fetchone()
            if task is None:
                raise TaskNotFound(task_id)
            refusal = rows.tenant_refusal(task, tenant)
            foreign = refusal is not None
            if refusal is None:
                existing = conn.execute(_Q["select_signal"], params).fetchone()
                if existing is not None:
                    if not rows.same_signal(existing, name, payload_text):
                        raise SignalConflict(task_id, signal_id)
                    return SignalDelivery(signal_id, created=False)
                pending = conn.execute(_Q["count_pending_signals"], params).fetchone()["pending"]
                refusal = rows.signal_refusal(task, pending, self._max_pending_signals)
            detail = rows.signal_detail(signal_id, name, sender, reason, refusal)
            if refusal is None:
                conn.execute(
                    _Q["insert_signal"],
                    params | {"payload": payload_text, "sender": sender, "reason": reason},
                )
                conn.execute(_Q["wake_for_signal"], params)
            _event(
                conn,
                now,
                task_id,
                "signal_received" if refusal is None else "signal_refused",
                None,
                None,
                detail,
            )
        if refusal is not None:  # raised after the commit, so the refusal stays recorded
            raise rows.refused_signal(task_id, signal_id, refusal, foreign=foreign)
        return SignalDelivery(signal_id, created=True)

    def cancel(self, task_id: str, actor: str, reason: str) -> TaskState:
        rows.check_operator(actor, reason)
        note = f"cancelled by {actor}: {reason}"
        with self._write() as (conn, now):
            params = {"task_id": task_id, "reason": note, "now": now}
            detail = {"actor": actor, "reason": reason}
            if conn.execute(_Q["cancel_unleased"], params).fetchone() is not None:
                _event(conn, now, task_id, "cancelled", None, None, detail)
                return TaskState.CANCELLED
            for query, state in (
                ("cancel_with_undo", TaskState.QUEUED),
                ("request_cancel", TaskState.LEASED),
            ):
                if conn.execute(_Q[query], params).fetchone() is not None:
                    _event(conn, now, task_id, "cancel_requested", None, None, detail)
                    return state
            raise rows.not_cancellable(
                self._record(conn.execute(_Q["select_task"], params).fetchone(), task_id)
            )

    def requeue(self, task_id: str, *, actor: str, reason: str) -> None:
        rows.check_operator(actor, reason)
        with self._write() as (conn, now):
            params = {"task_id": task_id, "now": now}
            if conn.execute(_Q["requeue_failed"], params).fetchone() is None:
                record = self._record(conn.execute(_Q["select_task"], params).fetchone(), task_id)
                raise rows.not_requeueable(record)
            _event(conn, now, task_id, "requeued", None, None, rows.requeued_detail(actor, reason))

    def get_task(self, task_id: str) -> TaskRecord:
        found = self._run("select_task", {"task_id": task_id})
        return self.explain_reasons([self._record(found[0] if found else None, task_id)])[0]

    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        tenant: str | None = None,
        definition: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        params = rows.list_filters(state, tenant, definition, limit)
        return self.explain_reasons(
            [self._record(row, row["task_id"]) for row in self._run("list_tasks", params)]
        )

    def referenced_versions(self) -> list[VersionReference]:
        return [rows.version_reference(row) for row in self._run("referenced_versions", {})]

    def queue_stats(self) -> list[QueueStats]:
        return [rows.queue_stats(row) for row in self._run("queue_stats", {})]

    def set_tenant_policy(self, policy: TenantPolicy) -> None:
        rows.check_policy(policy)
        budget = policy.budget
        self._run(
            "set_tenant_policy",
            {
                "tenant": policy.tenant,
                "max_leased": policy.max_leased,
                "budget_cost": None if budget is None else budget.cost,
                "budget_window_us": None if budget is None else in_us(budget.window),
            },
        )

    def tenant_admission(self) -> list[TenantAdmission]:
        return [
            rows.tenant_admission(
                row,
                time_at,
                None if row["budget_window_us"] is None else MICROSECOND * row["budget_window_us"],
            )
            for row in self._run("tenant_admission", {})
        ]

    def history(self, task_id: str) -> list[TaskEvent]:
        return [
            TaskEvent(
                row["event_id"],
                row["task_id"],
                time_at(row["at"]),
                row["kind"],
                row["worker_id"],
                row["fencing_token"],
                json.loads(row["detail"]),
            )
            for row in self._run("task_events", {"task_id": task_id})
        ]

    @staticmethod
    def _record(row: sqlite3.Row | None, task_id: str) -> TaskRecord:
        if row is None:
            raise TaskNotFound(task_id)
        return rows.task_record(row, time_at)

    # --- workers -----------------------------------------------------------------

    def claim(self, worker_id: WorkerId, lease: LeaseDuration, *, limit: int = 1) -> list[ClaimedTask]:
        with self._write() as (conn, now):
            return _claim_in(conn, now, ClaimRequest(worker_id, lease, limit))

    def heartbeat(self, lease: Lease, duration: LeaseDuration) -> Lease:
        found = self._run(
            "heartbeat",
            {"task_id": lease.task_id, "token": lease.fencing_token, "lease_us": in_us(duration.value)},
        )
        if not found:
            raise LeaseLostError(lease.task_id, lease.fencing_token, "heartbeat")
        return Lease(
            lease.task_id,
            lease.tenant,
            lease.worker_id,
            lease.fencing_token,
            time_at(found[0]["lease_expires"]),
            found[0]["cancel_requested"],
        )

    def commit_checkpoint(self, lease: Lease, revision: int, checkpoint_json: str) -> Committed:
        found = self._run(
            "commit_checkpoint",
            {
                "task_id": lease.task_id,
                "token": lease.fencing_token,
                "revision": revision,
                "checkpoint": checkpoint_json,
            },
        )
        if not found:
            raise LeaseLostError(lease.task_id, lease.fencing_token, "checkpoint commit")
        return Committed(found[0]["revision"], found[0]["cancel_requested"])

    def _fenced_transition(
        self, name: str, lease: Lease, params: dict[str, Any], event: str, detail: dict[str, Any]
    ) -> sqlite3.Row:
        with self._write() as (conn, now):
            return _fenced_update(conn, now, name, lease, params, event, detail)

    def suspend(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        *,
        wake_at: datetime | None,
        reason: str,
        signal: str | None = None,
    ) -> None:
        wake_us = None if wake_at is None else in_us(wake_at)
        self._fenced_transition(
            "suspend",
            lease,
            {
                "revision": revision,
                "checkpoint": checkpoint_json,
                "wake_at": wake_us,
                "reason": reason,
                "signal": signal,
            },
            "suspended",
            {"reason": reason},
        )

    def pending_signals(self, task_id: str, name: str | None = None) -> list[Signal]:
        query = "all_pending_signals" if name is None else "pending_signals"
        return [
            Signal(r["signal_id"], r["name"], r["payload"], r["sender"], r["reason"], time_at(r["sent_at"]))
            for r in self._run(query, {"task_id": task_id, "name": name})
        ]

    def consume_signal(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        signal_id: str,
        *,
        accepted: bool,
        note: str,
    ) -> Committed:
        with self._write() as (conn, now):
            params = {"task_id": lease.task_id, "token": lease.fencing_token, "revision": revision}
            row = conn.execute(_Q["commit_checkpoint"], params | {"checkpoint": checkpoint_json}).fetchone()
            if row is None:
                raise LeaseLostError(lease.task_id, lease.fencing_token, "signal consumption")
            consumed = conn.execute(
                _Q["consume_signal"], {"task_id": lease.task_id, "signal_id": signal_id, "now": now}
            ).fetchone()
            if consumed is None:
                raise InvalidState(f"signal {signal_id!r} of task {lease.task_id!r} is not pending")
            kind = "signal_consumed" if accepted else "signal_refused"
            detail = {"signal_id": signal_id, "sender": consumed["sender"], "note": note}
            _event(conn, now, lease.task_id, kind, lease.worker_id, lease.fencing_token, detail)
            return Committed(row["revision"], row["cancel_requested"])

    def acknowledge_cancel(self, lease: Lease, revision: int, checkpoint_json: str) -> None:
        row = self._fenced_transition(
            "acknowledge_cancel",
            lease,
            {"revision": revision, "checkpoint": checkpoint_json},
            "cancelled",
            {},
        )
        assert row is not None

    def retry(
        self, lease: Lease, revision: int, checkpoint_json: str, *, delay: timedelta, reason: str
    ) -> datetime:
        row = self._fenced_transition(
            "retry",
            lease,
            {
                "revision": revision,
                "checkpoint": checkpoint_json,
                "delay_us": in_us(delay),
                "reason": reason,
            },
            "retried",
            rows.retried_detail(reason, delay),
        )
        return time_at(row["ready_at"])

    def release(self, lease: Lease, *, delay: timedelta, reason: str) -> None:
        self._fenced_transition(
            "release",
            lease,
            {"delay_us": in_us(delay), "reason": reason},
            "released",
            {"reason": reason},
        )

    def complete(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        result_json: str,
        *,
        then_claim: ClaimRequest | None = None,
    ) -> list[ClaimedTask]:
        params = {"revision": revision, "checkpoint": checkpoint_json, "result": result_json}
        with self._write() as (conn, now):
            _fenced_update(conn, now, "complete", lease, params, "completed", {})
            return [] if then_claim is None else _claim_in(conn, now, then_claim)

    def fail(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str | None,
        *,
        reason: str,
        ambiguous_effect: str | None = None,
    ) -> None:
        self._fenced_transition(
            "fail",
            lease,
            {
                "revision": revision,
                "checkpoint": checkpoint_json,
                "reason": reason,
                "ambiguous_effect": ambiguous_effect,
            },
            "failed",
            rows.failed_detail(reason, ambiguous_effect),
        )

    # --- worker registry -----------------------------------------------------------

    def register_worker(
        self, worker_id: WorkerId, *, host: str, pid: int, definitions: list[tuple[str, int]]
    ) -> None:
        params = rows.worker_params(worker_id.value, host, pid, definitions)
        self._run("register_worker", params)

    def worker_seen(self, worker_id: WorkerId, pid: int) -> None:
        self._run("worker_seen", {"worker_id": worker_id.value, "pid": pid})

    def worker_stopped(self, worker_id: WorkerId, pid: int) -> None:
        self._run("worker_stopped", {"worker_id": worker_id.value, "pid": pid})

    def workers(self) -> list[WorkerRecord]:
        return [rows.worker_record(row, time_at) for row in self._run("list_workers", {})]

    # --- time ----------------------------------------------------------------------

    def now(self) -> datetime:
        return time_at(self._run("now", {})[0][0])

    def set_clock_offset(self, offset: timedelta) -> None:
        self._run("set_clock_offset", {"offset_us": in_us(offset)})

    def wait_for_work(self, timeout: timedelta) -> bool:
        """Poll until a task is due; see ``_WAIT_POLL_S``."""
        deadline = time.monotonic() + rows.check_wait_timeout(timeout)
        while True:
            version = self._data_version()
            due_in_s = self._run("seconds_until_due", {})[0][0]
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

    def _data_version(self) -> int:
        """Changes whenever another connection commits to the database."""
        try:
            version: int = self._conn().execute("PRAGMA data_version").fetchone()[0]
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"SQLite data_version on {self.path!r} failed: {exc}") from exc
        return version


def _fenced_update(
    conn: sqlite3.Connection,
    now: int,
    name: str,
    lease: Lease,
    params: dict[str, Any],
    event: str,
    detail: dict[str, Any],
) -> sqlite3.Row:
    """A fenced UPDATE and its history event, inside the caller's write transaction."""
    params = params | {"task_id": lease.task_id, "token": lease.fencing_token, "now": now}
    row = conn.execute(_Q[name], params).fetchone()
    if row is None:
        pending = None
        if name in rows.REFUSED_WHILE_CANCEL_PENDING:
            pending = conn.execute(_Q["pending_cancel"], params).fetchone()
        rows.refused_transition(lease, event, pending)
    _event(conn, now, lease.task_id, event, lease.worker_id, lease.fencing_token, detail)
    result: sqlite3.Row = row
    return result


def _claim_in(conn: sqlite3.Connection, now: int, request: ClaimRequest) -> list[ClaimedTask]:
    """The claim, inside the caller's write transaction at store time ``now`` (a bad
    limit rolls it back)."""
    limit = rows.check_claim_limit(request.limit)
    claimed = []
    candidates = conn.execute(_Q["claimable_tasks"], {"now": now, "limit": limit}).fetchall()
    for tenant in sorted({c["tenant"] for c in candidates}):
        conn.execute(_Q["mark_tenant_served"], {"tenant": tenant, "now": now})
    for candidate in candidates:
        row = conn.execute(
            _Q["lease_task"],
            {
                "task_id": candidate["task_id"],
                "worker_id": request.worker_id.value,
                "now": now,
                "lease_us": in_us(request.lease.value),
            },
        ).fetchone()
        detail = rows.claimed_detail(candidate["state"], candidate["worker_id"])
        _event(conn, now, row["task_id"], "claimed", request.worker_id.value, row["fencing_token"], detail)
        resolutions = {}
        if row["resolved"]:  # rare: only tasks an operator resolved have any
            resolutions = rows.effect_resolutions(
                conn.execute(_Q["resolutions_for_task"], {"task_id": row["task_id"]})
            )
        timing = {
            "due_at": candidate["ready_at"],
            "at": now,
            "from_state": candidate["state"],
            "previous_updated_at": candidate["updated_at"],
            "previous_signal": candidate["waiting_for_signal"],
        }
        claimed.append(rows.claimed_task(dict(row) | timing, request.worker_id.value, time_at, resolutions))
    return claimed


def _event(
    conn: sqlite3.Connection,
    now: int,
    task_id: str,
    kind: str,
    worker_id: str | None,
    token: int | None,
    detail: dict[str, Any],
) -> None:
    conn.execute(
        _Q["insert_event"],
        {
            "task_id": task_id,
            "now": now,
            "kind": kind,
            "worker_id": worker_id,
            "token": token,
            "detail": json.dumps(detail, sort_keys=True),
        },
    )
