"""The producer and operator operations of the shared SQL store: enqueue, the signal
names definition versions declare, signals, cancel, requeue, effect resolution and the
operators' logins, each written once over a :class:`Dialect`.

Each runs in one transaction of the dialect: its checks, its row changes, its history
event and (where idle workers should look again) its NOTIFY commit together. A refusal
that must stay on record (a refused signal) is raised after the commit.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from ..errors import SignalConflict, StoreUnavailable, TaskNotFound
from ..model import crashpoints, validate
from ..model.codec import to_json
from ..model.trace_context import current_traceparent
from ..model.values import DeclaredSignals, TaskState, WorkflowTask
from . import checks, event_details, refusals, row_records, signal_checks, sql_flow
from .dialect import Dialect, Event, Row, Transaction
from .records import EnqueueResult, SignalDelivery, TaskRecord
from .retries import retried


class OperatorOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect
    max_pending_signals: int

    def enqueue_many(self, tasks: list[WorkflowTask], *, connection: object = None) -> list[EnqueueResult]:
        """Enqueue several tasks in one transaction: all of them or, on a conflict,
        none. Results are in the order of ``tasks``. With ``connection`` (the
        application's own connection to this database: psycopg 3 for PostgreSQL,
        ``sqlite3`` for SQLite) in the application's open transaction, so the tasks
        exist only if it commits (and workers wake when it does). A task id is taken
        while its task is stored: once :meth:`prune` deleted it, the same id enqueues a
        new task."""
        tasks = checks.tasks(tasks)
        if connection is not None:
            with self.dialect.joined(connection) as tx:
                return insert_tasks(self.dialect, tx, tasks, self._cancel_in)

        return self._insert_retried(tasks, durable=True)

    def enqueue_child(self, task: WorkflowTask) -> EnqueueResult:
        """Enqueue a workflow's child task, for the engine: as :meth:`enqueue_many`, but
        committed without waiting for the disk. The parent's next commit, which records
        the child's handle, waits for it and makes this enqueue durable with its own (a
        database writes its log in order); until then a crash of the database may lose
        the child, and the parent's replay, which finds no handle recorded, enqueues it
        again. Ten children thus cost one wait for the disk rather than ten."""
        (result,) = self._insert_retried(checks.tasks([task]), durable=False)
        return result

    def _insert_retried(self, tasks: list[WorkflowTask], *, durable: bool) -> list[EnqueueResult]:
        """Checked ``tasks`` inserted in a transaction of their own, sent again after an
        outage (an id enqueues once, so that is safe)."""

        def insert() -> list[EnqueueResult]:
            with self.dialect.transaction(durable=durable) as tx:
                return insert_tasks(self.dialect, tx, tasks, self._cancel_in)

        return retried(insert)

    def declare_signals(self, declarations: Iterable[DeclaredSignals]) -> None:
        """Record the signal names each definition version declares (a worker does at
        start, for its registry), so :meth:`send_signal` can refuse a name the task's
        version does not declare. Recorded per fingerprint, and never removed."""
        declared = checks.declarations(declarations)
        with self.dialect.transaction() as tx:
            _declare(tx, declared)

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
        """Record a decision about the ambiguous effect a recoverable task failed on,
        and requeue the task. The decision and who made it go into the history.
        ``result_json`` (the effect's output, when it was applied) is None or a str of
        strict JSON text, kept in canonical form; anything else raises
        :class:`InvalidArgument` naming it, and nothing is written."""
        checks.operator(actor, reason)
        validate.flag("applied", applied)
        validate.text("task id", task_id)
        validate.text("effect key", effect_key)
        d = self.dialect
        result = d.json_in("result_json", checks.result_json(result_json))
        with d.transaction() as tx:
            params = {"task_id": task_id, "effect_key": effect_key}
            requeued = tx.one("requeue_resolved", params)
            if requeued is None:
                raise refusals.not_resolvable(
                    row_records.found_task(self.dialect, tx.one("select_task", params), task_id), effect_key
                )
            resolution = {"applied": applied, "result": result, "actor": actor, "reason": reason}
            tx.count("insert_resolution", params | resolution | {"now": requeued["at"]})
            detail = event_details.resolved(effect_key, applied, actor, reason)
            d.event(tx, Event(task_id, requeued["at"], "effect_resolved", detail))
            d.notify(tx)

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
        """Deliver a signal whose ``payload`` is a JSON-serializable value, deduplicated by
        ``signal_id`` (same name and payload, compared as canonical JSON: delivered once;
        other content: :class:`SignalConflict`). A payload that is not JSON, nests too
        deeply or is too large raises :class:`InvalidArgument` and nothing is stored.
        A sender of another tenant, checked before the signal id is looked up, gets
        :class:`TaskNotFound` exactly as for a task that does not exist (its refusal is
        recorded for operators). Refused with :class:`SignalRefused` for a finished task
        or a task at its cap of pending signals, and with :class:`SignalNotAccepted` for
        a signal its definition would refuse for certain (:mod:`.signal_checks`: a name
        it does not declare, a sender who is not an approver of the approval it waits
        for, a payload that is no decision). Every refusal is counted on the task
        (``TaskRecord.refused_signals``) and the first
        :data:`~.refusals.RECORDED_SIGNAL_REFUSALS` are recorded in its history too, each
        with sender and reason. The delivery says what was checked (``checked``); the
        rest is checked by the wait that takes it. Wakes the task if it waits for
        ``name``."""
        validate.text("task id", task_id)
        payload_text = checks.signal(name, signal_id, sender, tenant, reason, payload)
        d = self.dialect
        d.json_in("signal payload", payload_text)
        with d.transaction() as tx:
            params = {"task_id": task_id, "signal_id": signal_id, "name": name}
            task = tx.one("lock_task", params)
            if task is None:
                raise TaskNotFound(task_id)
            refusal = refusals.tenant_refusal(task, tenant)
            foreign = refusal is not None
            verdict = None
            if refusal is None:
                existing = tx.one("select_signal", params)
                if existing is not None:
                    if not refusals.same_signal(existing, name, payload_text):
                        raise SignalConflict(task_id, signal_id)
                    return SignalDelivery(signal_id, created=False)
                version = {k: task[k] for k in ("definition_name", "definition_version")}
                declared = tx.all("declared_signals", version)
                verdict = signal_checks.judge(task, declared, name, sender, payload_text)
                counted = tx.one("count_pending_signals", params)
                assert counted is not None
                refusal = refusals.signal_refusal(task, counted["pending"], self.max_pending_signals, verdict)
            detail = event_details.signal(signal_id, name, sender, reason, refusal)
            now = tx.now()
            if refusal is None:
                tx.count(
                    "insert_signal", params | {"payload": payload_text, "sender": sender, "reason": reason}
                )
                if tx.count("wake_for_signal", params | {"now": now}):
                    d.notify(tx)
                d.event(tx, Event(task_id, now, "signal_received", detail))
            else:
                tx.count("count_refused_signal", params)
                if task["refused_signals"] < refusals.RECORDED_SIGNAL_REFUSALS:
                    d.event(tx, Event(task_id, now, "signal_refused", detail))
        if refusal is not None:  # raised after the commit, so the refusal stays counted
            raise refusals.refused_signal(task_id, signal_id, refusal, foreign=foreign, verdict=verdict)
        assert verdict is not None  # judged, since the sender's tenant is the task's
        return SignalDelivery(signal_id, created=True, checked=verdict.checked)

    def cancel(self, task_id: str, actor: str, reason: str) -> TaskState:
        """Cancel a task; returns the state it is in now.

        - ``cancelled``: it was queued or waiting with nothing to undo, and ended at once.
        - ``queued``: it was queued or waiting with completed steps whose compensations
          have not run (its checkpoint's ``undo`` list is longer than ``compensated``).
          No step of its main function runs again: the next worker to claim it runs the
          compensations, checkpointed, and ends it cancelled.
        - ``leased``: it is running; its worker learns of the request at its next step
          boundary (every checkpoint commit answers with it) or heartbeat, stops there,
          compensates and ends it cancelled. A completion, suspension or retry that has
          not committed yet is refused (:class:`CancelPending`): the cancel wins.

        The task's unfinished child tasks (``ctx.start_child``), and theirs, are cancelled
        in the same transaction, each recorded with its parent as the actor; a child
        started ``detached=True`` is not (it runs to its own end). Completed
        external writes are not undone, except by declared compensations."""
        checks.operator(actor, reason)
        validate.text("task id", task_id)
        with self.dialect.transaction() as tx:
            if tx.one("select_task", {"task_id": task_id}) is None:
                raise TaskNotFound(task_id)
            return self._cancel_in(tx, task_id, actor, reason)

    def _cancel_in(self, tx: Transaction, task_id: str, actor: str, reason: str) -> TaskState:
        """Cancel ``task_id`` inside ``tx``, its unfinished children first: rows are
        locked child before parent, the order a child's own end takes them in
        (``wake_parent``), so the two cannot deadlock."""
        d = self.dialect
        for child in tx.all("unfinished_children", {"task_id": task_id}):
            self._cancel_in(
                tx, child["task_id"], task_id, f"its parent task was cancelled by {actor}: {reason}"
            )
        note = d.free_text(f"cancelled by {actor}: {reason}")
        detail = event_details.operator(actor, d.free_text(reason))
        params = {"task_id": task_id, "reason": note}
        # Lock the row first. Unlocked (PostgreSQL, READ COMMITTED), a worker's suspend,
        # retry or yield could commit between the UPDATEs below (leased when the first
        # looked, waiting when the last did) and an unfinished task would be refused.
        tx.one("lock_task", params)
        cancelled = tx.one("cancel_unleased", params)
        if cancelled is not None:
            d.event(tx, Event(task_id, cancelled["at"], "cancelled", detail))
            if cancelled["parent_id"] is not None:
                ended = {"task_id": task_id, "parent_id": cancelled["parent_id"], "now": cancelled["at"]}
                woke = tx.one("wake_parent", ended)
                if woke is not None and woke["woke"]:
                    d.notify(tx)
            return TaskState.CANCELLED
        for query, state in (
            ("cancel_with_undo", TaskState.QUEUED),
            ("request_cancel", TaskState.LEASED),
        ):
            requested = tx.one(query, params)
            if requested is not None:
                d.event(tx, Event(task_id, requested["at"], "cancel_requested", detail))
                if state is TaskState.QUEUED:
                    d.notify(tx)  # a worker runs its compensations now
                return state
        raise refusals.not_cancellable(
            row_records.found_task(self.dialect, tx.one("select_task", params), task_id)
        )

    def pause(self, task_id: str, *, actor: str, reason: str) -> TaskState:
        """Stop a task being claimed until :meth:`resume`; returns its state. A queued or
        waiting task stays as it is, its reason saying who paused it and why; a leased
        one learns of it from its next checkpoint commit or heartbeat and parks there
        (``waiting``). Timers that fall due, signals and children's ends meanwhile are
        kept for its next claim. A finished task, or one already paused: InvalidState."""
        checks.operator(actor, reason)
        d = self.dialect
        note = d.free_text(f"paused by {actor}: {reason}")
        with d.transaction() as tx:
            params = {"task_id": validate.text("task id", task_id), "note": note}
            if tx.one("lock_task", params) is None:
                raise TaskNotFound(task_id)
            for query, state in (("pause_unleased", None), ("request_pause", TaskState.LEASED)):
                paused = tx.one(query, params)
                if paused is not None:
                    d.event(tx, Event(task_id, paused["at"], "paused", event_details.operator(actor, reason)))
                    return state or row_records.found_task(d, tx.one("select_task", params), task_id).state
            raise refusals.not_pausable(row_records.found_task(d, tx.one("select_task", params), task_id))

    def resume(self, task_id: str, *, actor: str, reason: str) -> TaskState:
        """Undo :meth:`pause`: a queued or waiting task is due at once (its replay fires
        the timers that fell due, takes the signals that came); a leased one that has not
        parked yet goes on. A task that is not paused: InvalidState."""
        resumed = self._audited(task_id, actor, reason, "resume", "resumed", refusals.not_resumable)
        return TaskState(resumed["state"])

    def requeue(self, task_id: str, *, actor: str, reason: str) -> None:
        """Operator retry: put a failed task back in the queue, its completed steps kept.
        A task failed on an ambiguous effect needs :meth:`resolve_effect` instead."""
        self._audited(task_id, actor, reason, "requeue_failed", "requeued", refusals.not_requeueable)

    def _audited(
        self,
        task_id: str,
        actor: str,
        reason: str,
        query: str,
        kind: str,
        refusal: Callable[[TaskRecord], Exception],
    ) -> Row:
        """An operator's one-statement action: ``query`` on the task, its history event
        ``kind`` with who and why, and idle workers woken, in one transaction; a task the
        query does not match is refused with ``refusal(record)``."""
        checks.operator(actor, reason)
        d = self.dialect
        with d.transaction() as tx:
            params = {"task_id": validate.text("task id", task_id)}
            changed = tx.one(query, params)
            if changed is None:
                raise refusal(row_records.found_task(d, tx.one("select_task", params), task_id))
            d.event(tx, Event(task_id, changed["at"], kind, event_details.operator(actor, reason)))
            d.notify(tx)
            return changed

    # --- operator logins (the dashboard's sessions) ------------------------------------

    def start_login(self, lifetime: timedelta) -> str:
        """Start an operator's login, live for ``lifetime`` of store time unless
        :meth:`end_login` ends it first, and return its id: 256 random bits, known to
        the caller only (the store keeps a digest of it). Kept here, not only in a
        browser's cookie, so a logout or an expiry ends it for every process serving the
        dashboard. Expired logins are deleted here, so their rows stay as few as the
        logins of one lifetime."""
        lifetime = validate.positive_duration("login lifetime", lifetime)
        login_id = secrets.token_urlsafe(32)
        params = {"digest": _login_digest(login_id), "lifetime": self.dialect.db_duration(lifetime)}
        with self.dialect.transaction() as tx:
            tx.count("delete_expired_logins", {})
            tx.count("insert_login", params)
        return login_id

    def login_live(self, login_id: str) -> bool:
        """Whether the login ``login_id`` was started here and has neither ended nor
        expired."""
        params = {"digest": _login_digest(validate.text("login id", login_id))}
        return self.dialect.one("live_login", params) is not None

    def end_login(self, login_id: str) -> None:
        """End a login (an operator logged out); one that is not live is left as it is."""
        self.dialect.execute("end_login", {"digest": _login_digest(validate.text("login id", login_id))})


def _login_digest(login_id: str) -> str:
    """What the store keeps of a login id: its SHA-256, so the rows a database reader
    sees cannot be replayed as logins."""
    return hashlib.sha256(login_id.encode()).hexdigest()


def insert_tasks(
    d: Dialect, tx: Transaction, tasks: list[WorkflowTask], cancel: sql_flow.Cancel | None = None
) -> list[EnqueueResult]:
    """Insert checked ``tasks`` inside ``tx`` with their enqueued events, waking idle
    workers when one is new: what ``enqueue_many`` does, for the operations that enqueue
    as part of a larger transaction (a schedule's tick). Each new task keeps the trace
    context current here (``trace_context``), which every claim of it continues.

    Tasks without flow options go in together (:meth:`Dialect.insert_tasks`, one statement
    for a run of them), a task with a dedup key, a singleton or a debounce one by one
    after its key's lock (``sql_flow.collapsed``); a run is written before the flow task
    that follows it, so a batch is applied in its order. A task whose id is stored
    already is answered one by one as well."""
    results: list[EnqueueResult | None] = [None] * len(tasks)
    _declare(tx, {task.declared for task in tasks if task.declared is not None})
    traceparent = current_traceparent()  # the same span is current for the whole batch
    run: list[int] = []  # positions of the tasks without flow options not written yet
    for position, task in enumerate(tasks):
        if task.flow is None:
            run.append(position)
            continue
        _insert_run(d, tx, tasks, run, traceparent, results)
        run = []
        params = _task_params(d, task, traceparent)
        folded = sql_flow.collapsed(d, tx, task, params, cancel)
        results[position] = folded if folded is not None else _insert_one(d, tx, task, params)
    _insert_run(d, tx, tasks, run, traceparent, results)
    answers = [result for result in results if result is not None]
    assert len(answers) == len(tasks)
    created = sum(r.created for r in answers)
    if created:
        d.notify(tx, created)
    return answers


def _task_params(d: Dialect, task: WorkflowTask, traceparent: str | None) -> dict[str, Any]:
    """Query ``insert_task``'s parameters for ``task``."""
    return {
        "task_id": task.task_id,
        "definition_name": task.definition_name,
        "definition_version": task.definition_version,
        "tenant": task.tenant,
        "input": d.json_in("workflow input", task.input_json),
        "priority": task.priority,
        "not_before": None if task.not_before is None else d.db_time(task.not_before),
        "parent_id": task.parent_id,
        "trace_context": traceparent,
        "queue": task.queue,
        "detached": task.detached,
    } | sql_flow.flow_params(d, task)


def _insert_run(
    d: Dialect,
    tx: Transaction,
    tasks: list[WorkflowTask],
    run: list[int],
    traceparent: str | None,
    results: list[EnqueueResult | None],
) -> None:
    """Write the tasks at positions ``run`` (none with flow options) in one go, and
    answer each in ``results``; an id stored already goes the one-by-one way."""
    if not run:
        return
    rows = [
        _task_params(d, tasks[p], traceparent) | {"detail": event_details.enqueued(tasks[p])} for p in run
    ]
    inserted = {row["task_id"] for row in d.insert_tasks(tx, rows, traceparent)}
    if crashpoints.ARMED:
        crashpoints.reached("bulk_enqueue", tasks[run[0]].task_id)
    for position, params in zip(run, rows, strict=True):
        task = tasks[position]
        if task.task_id in inserted:
            results[position] = EnqueueResult(task.task_id, created=True)
        else:
            del params["detail"]
            results[position] = _insert_one(d, tx, task, params)


def _insert_one(d: Dialect, tx: Transaction, task: WorkflowTask, params: dict[str, Any]) -> EnqueueResult:
    """Insert ``task`` alone with its event, or answer for the stored task of its id."""
    inserted = tx.one("insert_task", params)
    if inserted is None:
        row = tx.one("select_task", params)
        if row is not None:
            return refusals.already_enqueued(task, row)  # a conflict rolls the batch back
        # On PostgreSQL, the task it conflicted with was pruned (store.prune) in
        # between: its id is free again, so this is a new task.
        inserted = tx.one("insert_task", params)
        if inserted is None:
            raise StoreUnavailable(f"task {task.task_id!r} conflicted on insert but cannot be read")
    d.event(tx, Event(task.task_id, inserted["at"], "enqueued", event_details.enqueued(task)))
    return EnqueueResult(task.task_id, created=True)


def _declare(tx: Transaction, declarations: Iterable[DeclaredSignals]) -> None:
    """Insert each version's signal names unless recorded already; in key order, so two
    workers starting at once take the index's locks in the same order."""
    ordered = sorted(
        declarations, key=lambda d: (d.definition.name, d.definition.version, d.definition.fingerprint)
    )
    for declared in ordered:
        ident = declared.definition
        tx.count(
            "declare_signals",
            {
                "definition_name": ident.name,
                "definition_version": ident.version,
                "fingerprint": ident.fingerprint,
                "signals": to_json(sorted(declared.names)),
            },
        )
