"""The worker's operations of the shared SQL store: the claim, and the fenced writes a
lease holder makes (heartbeat, checkpoint commits, events, suspend, signal consumption,
retry, release, complete, fail, continue as new), each written once over a
:class:`Dialect`.

A write of progress carries the checkpoint's head (the task row's ``head``) and the
journal rows that changed since the last write (``journal``): the fenced statement and
the rows are one atomic write, and rows are written only when the fence held.

Hot paths stay one round trip: a heartbeat is a single autocommit statement, and a
checkpoint commit or a transition with its history event is whatever the dialect makes
fastest (one statement with CTEs on PostgreSQL; the statements under ``BEGIN IMMEDIATE``
on SQLite).

Within a lease holder's patience (``retries.retrying_until``) each fenced write is sent
again when the store did not answer; a write that extends revision R and is refused on
a later attempt is checked for the row at R + 1 under its token (``write_applied``): the
earlier attempt applied it and only its answer was lost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime, timedelta
from typing import Any

from ..errors import InvalidArgument, InvalidState, LeaseLostError, StoreUnavailable
from ..model import validate
from ..model.attributes import Attribute
from ..model.checkpoint import JournalRow
from ..model.outcomes import FailureDetail
from ..model.values import LeaseDuration, WorkerId
from . import event_details, refusals, row_records, signal_checks
from .dialect import Dialect, Event, FencedTransition, Row, Transaction
from .records import (
    BatchCompleted,
    ClaimedTask,
    ClaimRequest,
    Committed,
    Completion,
    Lease,
    Routes,
    Signal,
    StreamWrite,
)
from .retries import retried
from .timing import OperationTimer, timed

# Opens the application's transaction for a transaction step and gives its driver
# connection (Django: ``transaction.atomic()`` on the store's database).
StepConnection = Callable[[], AbstractContextManager[object]]
# The check of a claim's and a wait's routes, composed once: a worker claims at every task.
_optional_routes = validate.optional(validate.is_a(Routes))


class WorkerOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect
    operation_timer: OperationTimer | None
    step_connection: StepConnection | None
    # Workers (their ids) a claim of which failed after it may have committed: each hands
    # back the leases it does not know of (``leases_of``) before it claims again.
    claims_in_doubt: set[str]

    def leases_of(self, worker_id: WorkerId) -> list[Lease]:
        """The unexpired leases ``worker_id`` holds. A claim whose answer was lost (its
        connection dropped after the commit) leased tasks its worker does not know of:
        the worker hands back those it does not hold (see :attr:`claims_in_doubt`)."""
        d = self.dialect
        rows = retried(lambda: d.all("leases_of_worker", {"worker_id": worker_id.value}))
        return [
            Lease(
                row["task_id"],
                row["tenant"],
                worker_id.value,
                row["fencing_token"],
                d.time(row["lease_expires"]),
                row["cancel_requested"],
                row["paused"],
            )
            for row in rows
        ]

    def bound_calls(self, lease: LeaseDuration) -> None:
        """A worker holding leases of ``lease`` uses this store: no store call may keep it
        past a lease's end. On PostgreSQL the network timeouts are derived from it and
        each statement must answer within half of it (``pgpool``); the shortest lease of
        the workers sharing the store counts. SQLite, on the worker's own disk, has
        nothing to bound."""
        self.dialect.bound_by_lease(lease.seconds)

    @timed
    def claim(
        self, worker_id: WorkerId, lease: LeaseDuration, *, limit: int = 1, routes: Routes | None = None
    ) -> list[ClaimedTask]:
        """Lease up to ``limit`` ready tasks (queued or waiting and due, or leased with an
        expired lease), raising each one's fencing token and claim count. With ``routes``
        (a worker's queues and definitions) only tasks it can run are taken; None takes
        any task."""
        request = ClaimRequest(worker_id, lease, limit, _optional_routes("routes", routes))
        try:
            return self.dialect.claim(request)
        except StoreUnavailable:
            self._in_doubt(request)
            raise

    def _in_doubt(self, request: ClaimRequest | None) -> None:
        """A call that claimed with ``request`` failed for an outage: its answer may have
        been lost after the claim committed, so the worker is put in
        :attr:`claims_in_doubt`. (Each such call catches the error itself rather than
        through a context manager: a claim comes with every task.)"""
        if request is not None:
            self.claims_in_doubt.add(request.worker_id.value)

    @timed
    def heartbeat(self, lease: Lease, duration: LeaseDuration) -> Lease:
        """Extend a held lease from store now; raises LeaseLostError if it is not held."""
        d = self.dialect
        params = {
            "task_id": lease.task_id,
            "token": lease.fencing_token,
            "lease": d.db_duration(duration.value),
        }

        def extend() -> Row:  # extending twice is harmless: sent again as it is
            row = d.one("heartbeat", params)
            if row is None:
                raise LeaseLostError(lease.task_id, lease.fencing_token, "heartbeat")
            return row

        row = retried(extend)
        return Lease(
            lease.task_id,
            lease.tenant,
            lease.worker_id,
            lease.fencing_token,
            d.time(row["lease_expires"]),
            row["cancel_requested"],
            row["paused"],
        )

    @timed
    def commit_checkpoint(
        self, lease: Lease, revision: int, checkpoint_json: str, *, journal: Sequence[JournalRow] = ()
    ) -> Committed:
        """Store progress that extends ``revision``: the checkpoint's head and the journal
        rows that changed; returns the new revision and any pending cancel request."""
        params = self._progress(lease, revision, checkpoint_json)
        return retried(
            functools.partial(fenced_commit, self.dialect, None, lease, params, journal, "checkpoint commit"),
            lambda: self._committed(lease, revision),
        )

    def _applied(self, lease: Lease, revision: int, *, leased: bool) -> Row | None:
        """The row of ``lease``'s task if a write of its holder left it at ``revision``,
        still leased or not (``leased``): that write applied, though its answer was lost
        (see ``retries.retried``); None otherwise."""
        params = {"task_id": lease.task_id, "token": lease.fencing_token, "revision": revision}
        row = self.dialect.one("write_applied", params)
        if row is None or (row["state"] == "leased") != leased:
            return None
        return row

    def _ended(self, lease: Lease, revision: int) -> bool | None:
        """True if a write ending the lease (its task no longer leased) extended
        ``revision``; None otherwise."""
        return None if self._applied(lease, revision + 1, leased=False) is None else True

    def _transition(self, change: FencedTransition) -> Row:
        """``change`` made (retried as ``retries.retried`` says): a write that ends the
        lease and extends the revision it names."""
        revision = change.params["revision"]
        return retried(
            lambda: self.dialect.transition(change),
            lambda: self._applied(change.lease, revision + 1, leased=False),
        )

    def _committed(self, lease: Lease, revision: int) -> Committed | None:
        """What a checkpoint commit extending ``revision`` returned, if it applied."""
        row = self._applied(lease, revision + 1, leased=True)
        return None if row is None else committed(row)

    def run_transaction_steps_on(self, step_connection: StepConnection) -> None:
        """Run ``@workflow.transaction()`` steps in the application's transaction on its
        own connection to this database, which ``step_connection()`` opens and commits
        (Django's ``atomic()``), rather than in one of the store's: the step's ORM writes
        and its checkpoint then commit, or roll back, together. Each connection is checked
        as ``enqueue(connection=)`` checks it."""
        if not callable(step_connection):
            validate.refuse("step_connection", "callable", step_connection)
        self.step_connection = step_connection

    @contextmanager
    def step_transaction(self) -> Iterator[StepTransaction]:
        """A transaction for a ``@workflow.transaction()`` step: its body's statements on
        ``connection``, then the fenced commit of the checkpoint recording it, committed
        together when the block ends (rolled back, body's writes included, if it raises)."""
        if self.step_connection is None:
            with self.dialect.transaction() as tx:
                yield StepTransaction(self, tx)
            return
        with self.step_connection() as connection, self.dialect.joined(connection) as tx:
            yield StepTransaction(self, tx)

    @timed
    def suspend(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        *,
        wake_at: datetime | None,
        reason: str,
        signal: str | None = None,
        approvers: Iterable[str] | None = None,
        child: str | None = None,
        journal: Sequence[JournalRow] = (),
    ) -> None:
        """Move to ``waiting`` until ``wake_at`` (store time) or, with ``signal``, until a
        signal of that name arrives (at once if one is already pending). ``approvers``:
        the wait is an approval that only they may decide, so :meth:`send_signal`
        refuses anyone else's decision while it lasts. With ``child`` (a task id), until
        that child task ends (at once if it has). Refused with :class:`CancelPending`
        while a cancel is requested."""
        d = self.dialect
        reason = d.free_text(validate.free_text("reason", reason))
        wake_at = validate.optional(validate.moment)("wake_at", wake_at)
        params = self._progress(lease, revision, checkpoint_json) | {
            "wake_at": None if wake_at is None else d.db_time(wake_at),
            "reason": reason,
            "signal": signal,
            "approval": signal_checks.waiting_approval(
                None if signal is None else approvers, lease.fencing_token
            ),
            "child": child,
        }

        def suspend() -> bool:
            with d.transaction() as tx:
                row = d.fenced(tx, "suspend", params, journal)
                if row is None:
                    refusals.refuse_transition(tx.one, "suspend", lease, "suspended", params)
                detail = {"reason": reason}
                event = Event(
                    lease.task_id, row["at"], "suspended", detail, lease.worker_id, lease.fencing_token
                )
                d.event(tx, event)
                woken = signal is not None and d.signal_pending_after_suspend(
                    tx, lease.task_id, signal, row["at"]
                )
                if child is not None:  # ended before the suspend, or while it waited for the row
                    ended = {"task_id": lease.task_id, "child": child, "now": row["at"]}
                    woken = bool(tx.count("wake_if_child_finished", ended)) or woken
                if wake_at is not None or woken:  # idle workers recompute the earliest due time
                    d.notify(tx)
            return True

        retried(suspend, lambda: self._ended(lease, revision))

    @timed
    def commit_event(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        key: str,
        value_json: str,
        *,
        journal: Sequence[JournalRow] = (),
    ) -> Committed:
        """Publish event ``key`` (``ctx.set_event``; last write wins) in the fenced write
        that commits the checkpoint as it stands, so the event is never ahead of the
        progress it reports (see ``engine.TaskRun.set_event``); returns what
        :meth:`commit_checkpoint` returns. On PostgreSQL it NOTIFYs ``get_event``'s
        waiters at commit."""
        d = self.dialect
        params = self._progress(lease, revision, checkpoint_json)
        value = d.json_in(f"value of event {key!r}", value_json)

        def commit() -> Committed:
            with d.transaction() as tx:
                committed = fenced_commit(d, tx, lease, params, journal, f"event {key!r} commit")
                tx.count("set_task_event", {"task_id": lease.task_id, "key": key, "value": value})
                return committed

        return retried(commit, lambda: self._committed(lease, revision))

    @timed
    def commit_attributes(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        attributes: Sequence[Attribute],
        *,
        journal: Sequence[JournalRow] = (),
    ) -> Committed:
        """Set the task's search ``attributes`` (``ctx.set_attributes``; per key, last
        write wins) in the fenced write that commits the checkpoint as it stands, as
        :meth:`commit_event` publishes an event; returns what :meth:`commit_checkpoint`
        returns."""
        d = self.dialect
        params = self._progress(lease, revision, checkpoint_json)

        def commit() -> Committed:
            with d.transaction() as tx:
                committed = fenced_commit(d, tx, lease, params, journal, "attributes commit")
                for a in attributes:
                    row = {"task_id": lease.task_id, "key": a.key, "kind": a.kind.value, "value": a.text}
                    tx.count("set_task_attribute", row)
                return committed

        return retried(commit, lambda: self._committed(lease, revision))

    @timed
    def commit_stream(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        write: StreamWrite,
        *,
        journal: Sequence[JournalRow] = (),
    ) -> Committed:
        """Append ``write`` to the task's stream (``ctx.write_stream``) in the fenced
        write that commits the checkpoint as it stands, as :meth:`commit_event`
        publishes an event; a write already there (same run, writer and seq) is not
        appended again. Returns what :meth:`commit_checkpoint` returns."""
        d = self.dialect
        params = self._progress(lease, revision, checkpoint_json)
        value = d.json_in(f"value of stream {write.key!r}", write.value_json)
        row = {"task_id": lease.task_id, "value": value, **write.place()}

        def commit() -> Committed:
            with d.transaction() as tx:
                committed = fenced_commit(d, tx, lease, params, journal, f"stream {write.key!r} commit")
                tx.count("append_stream", row)
                return committed

        return retried(commit, lambda: self._committed(lease, revision))

    @timed
    def append_stream(self, lease: Lease, write: StreamWrite) -> None:
        """Append ``write`` to the task's stream from a step body
        (``StepContext.write_stream``), fenced by ``lease`` but apart from any checkpoint
        commit: the value is visible before the step's result is recorded. A write
        already there (same run, writer, the step's call id, and seq) is not appended
        again, so a re-run of the step appends only what its earlier attempts did not.
        :class:`LeaseLostError` when the lease no longer holds."""
        d = self.dialect
        value = d.json_in(f"value of stream {write.key!r}", write.value_json)
        row = {"task_id": lease.task_id, "token": lease.fencing_token, "value": value, **write.place()}

        def append() -> None:  # sent again when unanswered: a second append is a no-op
            with d.transaction() as tx:
                if tx.one("stream_fence", row) is None:
                    raise LeaseLostError(lease.task_id, lease.fencing_token, f"stream {write.key!r} write")
                tx.count("append_stream", row)

        retried(append)

    def pending_signals(self, task_id: str, name: str | None = None) -> list[Signal]:
        """Signals not yet consumed, oldest first: those named ``name``, or all of them
        when ``name`` is None (a wait reads them all, to refuse the names its definition
        does not declare)."""
        query = "all_pending_signals" if name is None else "pending_signals"
        params = {"task_id": validate.text("task id", task_id), "name": name}
        found = retried(lambda: self.dialect.all(query, params))
        return [row_records.signal(row, self.dialect) for row in found]

    @timed
    def consume_signal(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        signal_id: str,
        *,
        accepted: bool,
        note: str,
        journal: Sequence[JournalRow] = (),
    ) -> Committed:
        """Commit the checkpoint that records a wait's decision about a signal and mark
        the signal consumed, in one fenced write; returns what
        :meth:`commit_checkpoint` returns."""
        d = self.dialect
        params = self._progress(lease, revision, checkpoint_json)

        def consume() -> Committed:
            with d.transaction() as tx:
                committed = fenced_commit(d, tx, lease, params, journal, "signal consumption")
                now = tx.now()
                consumed = tx.one(
                    "consume_signal", {"task_id": lease.task_id, "signal_id": signal_id, "now": now}
                )
                if consumed is None:
                    raise InvalidState(f"signal {signal_id!r} of task {lease.task_id!r} is not pending")
                kind = "signal_consumed" if accepted else "signal_refused"
                detail = {"signal_id": signal_id, "sender": consumed["sender"], "note": d.free_text(note)}
                d.event(tx, Event(lease.task_id, now, kind, detail, lease.worker_id, lease.fencing_token))
                return committed

        return retried(consume, lambda: self._committed(lease, revision))

    @timed
    def acknowledge_cancel(
        self, lease: Lease, revision: int, checkpoint_json: str, *, journal: Sequence[JournalRow] = ()
    ) -> None:
        """The worker stopped at a step boundary after a cancel request: end as cancelled."""
        params = {"revision": revision, "head": self.dialect.json_in("checkpoint", checkpoint_json)}
        self._transition(FencedTransition("acknowledge_cancel", lease, params, "cancelled", journal=journal))

    @timed
    def retry(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        *,
        delay: timedelta,
        reason: str,
        journal: Sequence[JournalRow] = (),
    ) -> datetime:
        """Requeue after ``delay`` counted from store now; returns when it is due.
        Refused with :class:`CancelPending` while a cancel is requested."""
        d = self.dialect
        reason = d.free_text(validate.free_text("reason", reason))
        params = {
            "revision": revision,
            "head": d.json_in("checkpoint", checkpoint_json),
            "delay": d.db_duration(validate.any_duration("delay", delay)),
            "reason": reason,
        }
        detail = event_details.retried(reason, delay)
        row = self._transition(FencedTransition("retry", lease, params, "retried", detail, True, journal))
        return d.time(row["ready_at"])

    @timed
    def release(self, lease: Lease, *, delay: timedelta, reason: str) -> None:
        """Hand the task back unchanged; the claim does not count as an attempt."""
        d = self.dialect
        reason = d.free_text(validate.free_text("reason", reason))
        params = {"delay": d.db_duration(validate.any_duration("delay", delay)), "reason": reason}
        change = FencedTransition("release", lease, params, "released", {"reason": reason}, notify=True)
        # No revision to check a lost answer against: a release that applied and is
        # refused when sent again reports the lease lost, which leaves the task queued.
        retried(lambda: d.transition(change))

    def leases_held_by(self, worker_id: WorkerId) -> list[Lease]:
        """The unexpired leases ``worker_id`` holds now: its running task and those it
        claimed ahead or holds for its batch's commit."""
        if not isinstance(worker_id, WorkerId):
            validate.refuse("worker_id", "a WorkerId (use WorkerId.parse)", worker_id)
        d = self.dialect
        return [
            Lease(
                row["task_id"],
                row["tenant"],
                row["worker_id"],
                row["fencing_token"],
                d.time(row["lease_expires"]),
                row["cancel_requested"],
                row["paused"],
            )
            for row in d.all("leases_held_by", {"worker_id": worker_id.value})
        ]

    @timed
    def hand_back_dead_leases(
        self, worker_id: WorkerId, leases: Sequence[Lease], *, reason: str
    ) -> list[str]:
        """Expire now the ``leases`` of ``worker_id``, whose process is known to be gone
        (its supervisor reaped it): each task is claimable at once instead of once its
        lease runs out. Fenced as every write of a lease holder is: a lease whose token is
        no longer the task's, or that ``worker_id`` no longer holds, is left as it is.
        The next claim counts as a claim after an expired lease does (an attempt, the
        dead worker recorded as its expired owner). Returns the ids of the tasks handed
        back, each with a ``handed_back`` history event giving ``reason``."""
        if not isinstance(worker_id, WorkerId):
            validate.refuse("worker_id", "a WorkerId (use WorkerId.parse)", worker_id)
        for lease in leases:
            if not isinstance(lease, Lease) or lease.worker_id != worker_id.value:
                validate.refuse("leases", f"Leases held by worker {worker_id}", lease)
        d = self.dialect
        reason = d.free_text(validate.free_text("reason", reason))
        handed: list[str] = []
        with d.transaction() as tx:
            for lease in leases:
                params = {
                    "task_id": lease.task_id,
                    "token": lease.fencing_token,
                    "worker_id": worker_id.value,
                }
                row = tx.one("hand_back_dead_lease", params)
                if row is None:
                    continue
                detail = {"reason": reason}
                d.event(
                    tx,
                    Event(
                        lease.task_id, row["at"], "handed_back", detail, worker_id.value, lease.fencing_token
                    ),
                )
                handed.append(lease.task_id)
            if handed:
                d.notify(tx)
        return handed

    @timed
    def complete(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        result_json: str,
        *,
        then_claim: ClaimRequest | None = None,
        journal: Sequence[JournalRow] = (),
    ) -> list[ClaimedTask]:
        """End the task completed; refused with :class:`CancelPending` while a cancel is
        requested (a cancel that reached the row first wins over the completion, even
        after the last step ran). With ``then_claim`` the same transaction then claims
        as :meth:`claim` would and returns what it leased: a worker that goes on working
        saves a commit per task. A refused completion (lease lost) claims nothing."""
        completion = self._completion(
            Completion(lease, revision, checkpoint_json, result_json, tuple(journal))
        )
        if then_claim is None:
            self._transition(completion)
            return []
        claim: ClaimRequest | None = then_claim

        def complete() -> list[ClaimedTask]:
            # Sent again, without the claim: what an attempt whose answer was lost
            # leased is not known (see claims_in_doubt), and claiming anew would lease more.
            nonlocal claim
            request, claim = claim, None
            try:
                done = self.dialect.complete_all([completion], request)
            except StoreUnavailable:
                self._in_doubt(request)
                raise
            if done.refused:
                raise done.refused[lease.task_id]
            return done.claimed

        return retried(complete, lambda: [] if self._ended(lease, revision) else None)

    @timed
    def complete_batch(
        self, completions: Sequence[Completion], *, then_claim: ClaimRequest | None = None
    ) -> BatchCompleted:
        """End each of ``completions`` as :meth:`complete` would, in one transaction, and
        then claim as ``then_claim`` says: a worker that ran several short tasks of a
        claim batch commits their ends once. A completion refused (a cancel requested, a
        lease lost) is reported with its error, not raised, and the others still commit;
        when every one is refused nothing is claimed."""
        if not completions:
            raise InvalidArgument("complete_batch needs at least one completion, got none")
        seen: set[str] = set()
        for completion in completions:
            task_id = completion.lease.task_id
            if task_id in seen:
                raise InvalidArgument(f"complete_batch got task {task_id!r} twice; a task completes once")
            seen.add(task_id)
        try:
            return self.dialect.complete_all([self._completion(c) for c in completions], then_claim)
        except StoreUnavailable:
            self._in_doubt(then_claim)
            raise

    def _completion(self, completion: Completion) -> FencedTransition:
        d = self.dialect
        params = {
            "revision": completion.revision,
            "head": d.json_in("checkpoint", completion.checkpoint_json),
            "result": d.json_in("result", completion.result_json),
        }
        return FencedTransition("complete", completion.lease, params, "completed", journal=completion.journal)

    @timed
    def fail(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str | None,
        *,
        reason: str,
        ambiguous_effect: str | None = None,
        error: FailureDetail | None = None,
        journal: Sequence[JournalRow] = (),
    ) -> None:
        """End the task as failed. With ``ambiguous_effect`` (an effect key) the task is
        recoverable through :meth:`resolve_effect`. ``error`` (what failed, where) is
        recorded in the ``failed`` event's detail."""
        d = self.dialect
        reason = d.free_text(validate.free_text("reason", reason))
        params = {
            "revision": revision,
            "head": d.json_in("checkpoint", checkpoint_json),
            "reason": reason,
            "ambiguous_effect": ambiguous_effect,
        }
        detail = event_details.failed(reason, ambiguous_effect, error)
        self._transition(FencedTransition("fail", lease, params, "failed", detail, journal=journal))

    @timed
    def continue_as_new(
        self, lease: Lease, revision: int, checkpoint_json: str, input_json: str, *, run: int
    ) -> None:
        """End the task's current run and queue it afresh, ready now, as run number
        ``run`` with ``input_json`` and that run's head (``checkpoint_json``); the journal
        rows go in the same write. Refused with :class:`CancelPending` while a cancel is
        requested."""
        d = self.dialect
        params = self._progress(lease, revision, checkpoint_json) | {"input": d.json_in("input", input_json)}

        def renew() -> bool:
            with d.transaction() as tx:
                row = tx.one("continue_as_new", params)
                if row is None:
                    refusals.refuse_transition(tx.one, "continue_as_new", lease, "continued", params)
                tx.count("clear_journal", {"task_id": lease.task_id})
                event = Event(
                    lease.task_id, row["at"], "continued", {"run": run}, lease.worker_id, lease.fencing_token
                )
                d.event(tx, event)
                d.notify(tx)
            return True

        retried(renew, lambda: self._ended(lease, revision))

    @timed
    def forgive_lost_claim(self, lease: Lease, revision: int) -> bool:
        """The worker that held ``lease`` lived through losing it, cut off from the store
        (it did not crash): its claim no longer counts toward the crash-loop rule
        (``claims_since_progress`` against ``Budget.max_attempts``), unless progress was
        committed since (``revision`` is the one the claim saw) or the holder ended the
        lease itself. Recorded as a ``lease_lost`` event; a claim is taken back once, so
        sending this again is harmless. True when this call took it back."""
        d = self.dialect
        params = {"task_id": lease.task_id, "token": lease.fencing_token, "revision": revision}

        def forgive() -> bool:
            with d.transaction() as tx:
                if tx.one("lock_task", {"task_id": lease.task_id}) is None:
                    return False  # pruned since
                if tx.one("forgive_lost_claim", params) is None:
                    return False
                detail = {"reason": "its worker was cut off from the store; not counted as a crash"}
                d.event(
                    tx,
                    Event(
                        lease.task_id, tx.now(), "lease_lost", detail, lease.worker_id, lease.fencing_token
                    ),
                )
                return True

        return retried(forgive)

    def _progress(self, lease: Lease, revision: int, checkpoint_json: str) -> dict[str, Any]:
        """The parameters every fenced write of progress has: who writes, the revision it
        extends, and the head."""
        return {
            "task_id": lease.task_id,
            "token": lease.fencing_token,
            "revision": revision,
            "head": self.dialect.json_in("checkpoint", checkpoint_json),
        }

    def wait_for_work(self, timeout: timedelta, routes: Routes | None = None) -> bool:
        """Block until a task is claimable (queued or waiting and due, or leased with an
        expired lease; with ``routes``, one those routes can claim) or ``timeout`` has
        passed; True when work is claimable. A hint for
        idle workers, not a reservation: another worker may claim it first. PostgreSQL
        wakes on ``NOTIFY runifold_tasks`` and when the earliest timer comes due; SQLite,
        which has no notifications, polls."""
        return self.dialect.wait_for_work(
            validate.duration("wait timeout", timeout).total_seconds(),
            _optional_routes("routes", routes),
        )


class StepTransaction:
    """The open transaction of a ``@workflow.transaction()`` step."""

    def __init__(self, store: WorkerOperations, tx: Transaction) -> None:
        self._store = store
        self._tx = tx
        self.connection = tx.connection()

    def commit_checkpoint(
        self, lease: Lease, revision: int, checkpoint_json: str, *, journal: Sequence[JournalRow] = ()
    ) -> Committed:
        """The checkpoint commit recording the step, fenced as every commit is, inside the
        step's transaction: refused (LeaseLostError), the whole transaction rolls back."""
        params = self._store._progress(lease, revision, checkpoint_json)
        return fenced_commit(self._store.dialect, self._tx, lease, params, journal, "transaction step commit")


def fenced_commit(
    d: Dialect,
    tx: Transaction | None,
    lease: Lease,
    params: dict[str, Any],
    journal: Sequence[JournalRow],
    what: str,
) -> Committed:
    """The fenced write of a checkpoint that every commit of progress makes (in ``tx``,
    or in a transaction of its own when None), and what the task row held when it
    committed: a cancel or a pause that reached it is learnt at this boundary, whatever
    else the commit carries. :class:`LeaseLostError` naming ``what`` when the fence did
    not hold."""
    row = d.fenced(tx, "commit_checkpoint", params, journal)
    if row is None:
        raise LeaseLostError(lease.task_id, lease.fencing_token, what)
    return committed(row)


def committed(row: Row) -> Committed:
    """What a task row held after a commit of progress: its revision, and whether a cancel
    or a pause has reached it."""
    return Committed(row["revision"], row["cancel_requested"], row["paused"])
