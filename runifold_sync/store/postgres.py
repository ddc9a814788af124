"""PostgreSQL store on psycopg 3 and a ``psycopg_pool.ConnectionPool``: for several
processes and hosts claiming from one database.

- Time is the database's: ``clock_timestamp()`` plus the offset in ``runifold_clock``,
  never ``now()``, which is frozen at transaction start.
- A claim is one statement that locks candidates with ``FOR UPDATE SKIP LOCKED`` in a CTE
  and leases exactly those; its history events follow in the same transaction.
- Every transition and its event commit together; enqueue, retry, release, suspend and
  resolve also ``NOTIFY runifold_tasks`` (delivered at commit) to wake idle workers
  blocked in :meth:`PostgresWorkflowStore.wait_for_work`.
- The pool belongs to the process that opened it: any use from a forked child raises
  :class:`StoreUsedAcrossFork`; open a new store in the child after it starts.
- Driver errors become :class:`StoreUnavailable` in one place, ``pgpool.ProcessPool``.
- The statements, and how their rows become values, are in ``pgstatements``.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

from psycopg.rows import DictRow

from ..admission import TenantAdmission, TenantPolicy
from ..errors import (
    InvalidArgument,
    InvalidState,
    LeaseLostError,
    SchemaTooNew,
    SignalConflict,
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
from .pgpool import ProcessPool
from .pgstatements import (
    Q,
    claim_in,
    free_text,
    insert_event,
    jsonb,
    store_now,
    task_of,
    transition_params,
    transition_with_event,
    utc,
)
from .queries import load_migrations

# pg_advisory_xact_lock key that serializes migrations of one database ("RUNIFOLD").
_MIGRATION_LOCK = 0x52554E49464F4C44


class PostgresWorkflowStore(WorkflowStore):
    def __init__(self, pool: ProcessPool, *, max_pending_signals: int = rows.MAX_PENDING_SIGNALS) -> None:
        self._pool = pool
        self._max_pending_signals = rows.check_pending_cap(max_pending_signals)

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
        max_pending_signals: int = rows.MAX_PENDING_SIGNALS,
    ) -> PostgresWorkflowStore:
        """Open a connection pool on ``url`` (a ``postgresql://`` URL or a libpq conninfo)
        in this process and migrate the schema. ``connect_timeout`` bounds the wait for
        the first connections, ``pool_timeout`` the wait for a free one later;
        ``max_pending_signals`` caps the signals a task keeps unconsumed."""
        rows.check_pending_cap(max_pending_signals)
        pool = ProcessPool.open(
            url,
            min_size=min_size,
            max_size=max_size,
            connect_timeout=connect_timeout,
            pool_timeout=pool_timeout,
        )
        store = cls(pool, max_pending_signals=max_pending_signals)
        if migrate:
            try:
                store.migrate()
            except BaseException:
                store.close()
                raise
        return store

    def _execute(self, name: str, params: dict[str, Any]) -> None:
        """One statement without a result, its own transaction (autocommit)."""
        self._pool.execute(Q[name], params)

    def _all(self, name: str, params: dict[str, Any]) -> list[DictRow]:
        return self._pool.fetch_all(Q[name], params)

    def _one(self, name: str, params: dict[str, Any]) -> DictRow | None:
        """One statement, its own transaction (autocommit)."""
        return self._pool.fetch_one(Q[name], params)

    def migrate(self) -> int:
        """Apply pending numbered migrations under an advisory lock, so workers starting
        at once migrate one after another; returns the schema version."""
        migrations = load_migrations("postgres")
        latest = migrations[-1][0]
        with self._pool.transaction() as conn:
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS runifold_schema "
                "(version INTEGER PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())"
            )
            row = conn.execute("SELECT COALESCE(MAX(version), 0) AS version FROM runifold_schema").fetchone()
            current = 0 if row is None else int(row["version"])
            if current > latest:
                raise SchemaTooNew(
                    f"{self._pool.where} has schema version {current}; this runifold_sync knows "
                    f"up to {latest}. Upgrade runifold_sync."
                )
            for version, script in migrations:
                if version > current:
                    conn.execute(script)  # several statements: no parameters, simple protocol
                    conn.execute("INSERT INTO runifold_schema (version) VALUES (%s)", (version,))
        return latest

    def close(self) -> None:
        """Close the pool; idempotent. In a forked child it only marks the store closed:
        the parent's connections must not be touched from there."""
        self._pool.close()

    # --- producers and operators -------------------------------------------------

    def enqueue_many(self, tasks: list[WorkflowTask]) -> list[EnqueueResult]:
        rows.check_tasks(tasks)
        results = []
        with self._pool.transaction() as conn:
            for task in tasks:
                params = {
                    "task_id": task.task_id,
                    "definition_name": task.definition_name,
                    "definition_version": task.definition_version,
                    "tenant": task.tenant,
                    "input": jsonb("workflow input", task.input_json),
                    "priority": task.priority,
                    "not_before": task.not_before,
                }
                inserted = conn.execute(Q["insert_task"], params).fetchone()
                if inserted is not None:
                    insert_event(
                        conn, inserted["at"], task.task_id, "enqueued", None, None, rows.enqueued_detail(task)
                    )
                    results.append(EnqueueResult(task.task_id, created=True))
                    continue
                row = conn.execute(Q["select_task"], {"task_id": task.task_id}).fetchone()
                if row is None:  # inserted and deleted in between: nothing deletes tasks today
                    raise StoreUnavailable(f"task {task.task_id!r} conflicted on insert but cannot be read")
                results.append(rows.already_enqueued(task, row))  # a conflict rolls the batch back
            if any(r.created for r in results):
                conn.execute(Q["notify_work"])
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
        result = jsonb("effect result", result_json)
        with self._pool.transaction() as conn:
            params = {"task_id": task_id, "effect_key": effect_key}
            requeued = conn.execute(Q["requeue_resolved"], params).fetchone()
            if requeued is None:
                record = task_of(conn.execute(Q["select_task"], params).fetchone(), task_id)
                raise rows.not_resolvable(record, effect_key)
            conn.execute(
                Q["insert_resolution"],
                params
                | {
                    "applied": applied,
                    "result": result,
                    "actor": actor,
                    "reason": reason,
                    "now": requeued["at"],
                },
            )
            detail = rows.resolved_detail(effect_key, applied, actor, reason)
            insert_event(conn, requeued["at"], task_id, "effect_resolved", None, None, detail)
            conn.execute(Q["notify_work"])

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
        jsonb("signal payload", payload_text)
        refusal = None
        with self._pool.transaction() as conn:
            params = {"task_id": task_id, "signal_id": signal_id, "name": name}
            task = conn.execute(Q["lock_task"], params).fetchone()
            if task is None:
                raise TaskNotFound(task_id)
            refusal = rows.tenant_refusal(task, tenant)
            foreign = refusal is not None
            if refusal is None:
                existing = conn.execute(Q["select_signal"], params).fetchone()
                if existing is not None:
                    if not rows.same_signal(existing, name, payload_text):
                        raise SignalConflict(task_id, signal_id)
                    return SignalDelivery(signal_id, created=False)
                counted = conn.execute(Q["count_pending_signals"], params).fetchone()
                assert counted is not None
                refusal = rows.signal_refusal(task, counted["pending"], self._max_pending_signals)
            detail = rows.signal_detail(signal_id, name, sender, reason, refusal)
            now = store_now(conn)
            if refusal is None:
                conn.execute(
                    Q["insert_signal"],
                    params | {"payload": payload_text, "sender": sender, "reason": reason},
                )
                if conn.execute(Q["wake_for_signal"], params | {"now": now}).rowcount:
                    conn.execute(Q["notify_work"])
            kind = "signal_received" if refusal is None else "signal_refused"
            insert_event(conn, now, task_id, kind, None, None, detail)
        if refusal is not None:  # raised after the commit, so the refusal stays recorded
            raise rows.refused_signal(task_id, signal_id, refusal, foreign=foreign)
        return SignalDelivery(signal_id, created=True)

    def cancel(self, task_id: str, actor: str, reason: str) -> TaskState:
        rows.check_operator(actor, reason)
        note = free_text(f"cancelled by {actor}: {reason}")
        detail = {"actor": actor, "reason": free_text(reason)}
        with self._pool.transaction() as conn:
            params = {"task_id": task_id, "reason": note}
            # Lock the row first. Unlocked, a worker's suspend, retry or yield could commit
            # between the UPDATEs below (leased when the first looked, waiting when the
            # last did) and an unfinished task would be refused as not cancellable.
            if conn.execute(Q["lock_task"], params).fetchone() is None:
                raise TaskNotFound(task_id)
            cancelled = conn.execute(Q["cancel_unleased"], params).fetchone()
            if cancelled is not None:
                insert_event(conn, cancelled["at"], task_id, "cancelled", None, None, detail)
                return TaskState.CANCELLED
            for query, state in (
                ("cancel_with_undo", TaskState.QUEUED),
                ("request_cancel", TaskState.LEASED),
            ):
                requested = conn.execute(Q[query], params).fetchone()
                if requested is not None:
                    insert_event(conn, requested["at"], task_id, "cancel_requested", None, None, detail)
                    if state is TaskState.QUEUED:
                        conn.execute(Q["notify_work"])  # a worker runs its compensations now
                    return state
            raise rows.not_cancellable(task_of(conn.execute(Q["select_task"], params).fetchone(), task_id))

    def requeue(self, task_id: str, *, actor: str, reason: str) -> None:
        rows.check_operator(actor, reason)
        with self._pool.transaction() as conn:
            params = {"task_id": task_id}
            requeued = conn.execute(Q["requeue_failed"], params).fetchone()
            if requeued is None:
                raise rows.not_requeueable(
                    task_of(conn.execute(Q["select_task"], params).fetchone(), task_id)
                )
            insert_event(
                conn, requeued["at"], task_id, "requeued", None, None, rows.requeued_detail(actor, reason)
            )
            conn.execute(Q["notify_work"])

    def get_task(self, task_id: str) -> TaskRecord:
        return self.explain_reasons([task_of(self._one("select_task", {"task_id": task_id}), task_id)])[0]

    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        tenant: str | None = None,
        definition: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        found = self._all("list_tasks", rows.list_filters(state, tenant, definition, limit))
        return self.explain_reasons([task_of(row, row["task_id"]) for row in found])

    def referenced_versions(self) -> list[VersionReference]:
        return [rows.version_reference(row) for row in self._all("referenced_versions", {})]

    def queue_stats(self) -> list[QueueStats]:
        return [rows.queue_stats(row) for row in self._all("queue_stats", {})]

    def set_tenant_policy(self, policy: TenantPolicy) -> None:
        rows.check_policy(policy)
        budget = policy.budget
        self._execute(
            "set_tenant_policy",
            {
                "tenant": policy.tenant,
                "max_leased": policy.max_leased,
                "budget_cost": None if budget is None else budget.cost,
                "budget_window_s": None if budget is None else budget.window.total_seconds(),
            },
        )

    def tenant_admission(self) -> list[TenantAdmission]:
        return [
            rows.tenant_admission(
                row,
                utc,
                None if row["budget_window_s"] is None else timedelta(seconds=float(row["budget_window_s"])),
            )
            for row in self._all("tenant_admission", {})
        ]

    def history(self, task_id: str) -> list[TaskEvent]:
        found = self._all("task_events", {"task_id": task_id})
        return [
            TaskEvent(
                row["event_id"],
                row["task_id"],
                utc(row["at"]),
                row["kind"],
                row["worker_id"],
                row["fencing_token"],
                row["detail"],
            )
            for row in found
        ]

    # --- workers -----------------------------------------------------------------

    def claim(self, worker_id: WorkerId, lease: LeaseDuration, *, limit: int = 1) -> list[ClaimedTask]:
        # Pipelined: BEGIN, the tenant locks and the claim (with its events) go out
        # together, and the claim statement still runs after the locks are held.
        with self._pool.pipelined_transaction() as conn:
            return claim_in(conn, ClaimRequest(worker_id, lease, limit))

    def heartbeat(self, lease: Lease, duration: LeaseDuration) -> Lease:
        row = self._one(
            "heartbeat", {"task_id": lease.task_id, "token": lease.fencing_token, "lease_s": duration.seconds}
        )
        if row is None:
            raise LeaseLostError(lease.task_id, lease.fencing_token, "heartbeat")
        return Lease(
            lease.task_id,
            lease.tenant,
            lease.worker_id,
            lease.fencing_token,
            utc(row["lease_expires"]),
            row["cancel_requested"],
        )

    def commit_checkpoint(self, lease: Lease, revision: int, checkpoint_json: str) -> Committed:
        row = self._one(
            "commit_checkpoint",
            {
                "task_id": lease.task_id,
                "token": lease.fencing_token,
                "revision": revision,
                "checkpoint": jsonb("checkpoint", checkpoint_json),
            },
        )
        if row is None:
            raise LeaseLostError(lease.task_id, lease.fencing_token, "checkpoint commit")
        return Committed(row["revision"], row["cancel_requested"])

    def _fenced_transition(
        self,
        name: str,
        lease: Lease,
        params: dict[str, Any],
        event: str,
        detail: dict[str, Any],
        *,
        notify: bool,
    ) -> DictRow:
        """One fenced UPDATE with its history event (and NOTIFY) in one statement: one
        round trip, and the event is written exactly when the update matched."""
        params = transition_params(lease, params, event, detail)
        row = self._one(transition_with_event(name, notify), params)
        if row is None:
            pending = (
                self._one("pending_cancel", params) if name in rows.REFUSED_WHILE_CANCEL_PENDING else None
            )
            rows.refused_transition(lease, event, pending)
        return row

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
        reason = free_text(reason)
        params = {
            "revision": revision,
            "checkpoint": jsonb("checkpoint", checkpoint_json),
            "wake_at": wake_at,
            "reason": reason,
            "signal": signal,
        }
        with self._pool.transaction() as conn:
            params |= {"task_id": lease.task_id, "token": lease.fencing_token}
            row = conn.execute(Q["suspend"], params).fetchone()
            if row is None:
                rows.refused_transition(
                    lease, "suspended", conn.execute(Q["pending_cancel"], params).fetchone()
                )
            insert_event(
                conn,
                row["at"],
                lease.task_id,
                "suspended",
                lease.worker_id,
                lease.fencing_token,
                {"reason": reason},
            )
            # A delivery that held the row lock while the suspend waited for it committed
            # after the suspend's snapshot; this new statement sees it and wakes the task.
            woken = (
                signal is not None
                and conn.execute(
                    Q["wake_if_signal_pending"], {"task_id": lease.task_id, "name": signal, "now": row["at"]}
                ).rowcount
            )
            if wake_at is not None or woken:  # idle workers recompute the earliest due time
                conn.execute(Q["notify_work"])

    def pending_signals(self, task_id: str, name: str | None = None) -> list[Signal]:
        query = "all_pending_signals" if name is None else "pending_signals"
        return [
            Signal(r["signal_id"], r["name"], r["payload"], r["sender"], r["reason"], utc(r["sent_at"]))
            for r in self._all(query, {"task_id": task_id, "name": name})
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
        with self._pool.transaction() as conn:
            params = {"task_id": lease.task_id, "token": lease.fencing_token, "revision": revision}
            checkpoint = jsonb("checkpoint", checkpoint_json)
            row = conn.execute(Q["commit_checkpoint"], params | {"checkpoint": checkpoint}).fetchone()
            if row is None:
                raise LeaseLostError(lease.task_id, lease.fencing_token, "signal consumption")
            now = store_now(conn)
            consumed = conn.execute(
                Q["consume_signal"], {"task_id": lease.task_id, "signal_id": signal_id, "now": now}
            ).fetchone()
            if consumed is None:
                raise InvalidState(f"signal {signal_id!r} of task {lease.task_id!r} is not pending")
            kind = "signal_consumed" if accepted else "signal_refused"
            detail = {"signal_id": signal_id, "sender": consumed["sender"], "note": free_text(note)}
            insert_event(conn, now, lease.task_id, kind, lease.worker_id, lease.fencing_token, detail)
            return Committed(row["revision"], row["cancel_requested"])

    def acknowledge_cancel(self, lease: Lease, revision: int, checkpoint_json: str) -> None:
        params = {"revision": revision, "checkpoint": jsonb("checkpoint", checkpoint_json)}
        self._fenced_transition("acknowledge_cancel", lease, params, "cancelled", {}, notify=False)

    def retry(
        self, lease: Lease, revision: int, checkpoint_json: str, *, delay: timedelta, reason: str
    ) -> datetime:
        reason = free_text(reason)
        row = self._fenced_transition(
            "retry",
            lease,
            {
                "revision": revision,
                "checkpoint": jsonb("checkpoint", checkpoint_json),
                "delay_s": delay.total_seconds(),
                "reason": reason,
            },
            "retried",
            rows.retried_detail(reason, delay),
            notify=True,
        )
        return utc(row["ready_at"])

    def release(self, lease: Lease, *, delay: timedelta, reason: str) -> None:
        reason = free_text(reason)
        self._fenced_transition(
            "release",
            lease,
            {"delay_s": delay.total_seconds(), "reason": reason},
            "released",
            {"reason": reason},
            notify=True,
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
        params = {
            "revision": revision,
            "checkpoint": jsonb("checkpoint", checkpoint_json),
            "result": jsonb("result", result_json),
        }
        if then_claim is None:
            self._fenced_transition("complete", lease, params, "completed", {}, notify=False)
            return []
        query = Q[transition_with_event("complete", False)]
        with self._pool.pipelined_transaction() as conn:
            params = transition_params(lease, params, "completed", {})
            completed = conn.execute(query, params)
            claimed = claim_in(conn, then_claim)
            if completed.fetchone() is None:  # rolls the claim back with it
                rows.refused_transition(
                    lease, "completed", conn.execute(Q["pending_cancel"], params).fetchone()
                )
            return claimed

    def fail(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str | None,
        *,
        reason: str,
        ambiguous_effect: str | None = None,
    ) -> None:
        reason = free_text(reason)
        self._fenced_transition(
            "fail",
            lease,
            {
                "revision": revision,
                "checkpoint": jsonb("checkpoint", checkpoint_json),
                "reason": reason,
                "ambiguous_effect": ambiguous_effect,
            },
            "failed",
            rows.failed_detail(reason, ambiguous_effect),
            notify=False,
        )

    def wait_for_work(self, timeout: timedelta) -> bool:
        """LISTEN on ``runifold_tasks`` and sleep until a notification or the earliest
        due time (a timer, a backoff, a lease expiry), whichever comes first."""
        deadline = time.monotonic() + rows.check_wait_timeout(timeout)
        with self._pool.connection() as conn:
            conn.execute(Q["listen_work"])  # before looking, so no notification is missed
            try:
                while True:
                    row = conn.execute(Q["seconds_until_due"]).fetchone()
                    due_in_s = None if row is None else row["due_in_s"]
                    if due_in_s is not None and due_in_s <= 0:
                        return True
                    remaining_s = deadline - time.monotonic()
                    if remaining_s <= 0:
                        return False
                    sleep_s = remaining_s if due_in_s is None else min(remaining_s, due_in_s)
                    # Any notification means "look again": the loop re-reads the due time.
                    for _ in conn.notifies(timeout=sleep_s, stop_after=1):
                        pass
            finally:
                conn.execute(Q["unlisten_work"])

    # --- worker registry -----------------------------------------------------------

    def register_worker(
        self, worker_id: WorkerId, *, host: str, pid: int, definitions: list[tuple[str, int]]
    ) -> None:
        params = rows.worker_params(worker_id.value, host, pid, definitions)
        self._execute("register_worker", params)

    def worker_seen(self, worker_id: WorkerId, pid: int) -> None:
        self._execute("worker_seen", {"worker_id": worker_id.value, "pid": pid})

    def worker_stopped(self, worker_id: WorkerId, pid: int) -> None:
        self._execute("worker_stopped", {"worker_id": worker_id.value, "pid": pid})

    def workers(self) -> list[WorkerRecord]:
        return [rows.worker_record(row, utc) for row in self._all("list_workers", {})]

    # --- time ----------------------------------------------------------------------

    def now(self) -> datetime:
        row = self._one("now", {})
        assert row is not None
        return utc(row["now"])

    def set_clock_offset(self, offset: timedelta) -> None:
        if not isinstance(offset, timedelta):
            raise InvalidArgument(f"clock offset must be a timedelta, got {offset!r}")
        self._execute("set_clock_offset", {"offset_s": offset.total_seconds()})
