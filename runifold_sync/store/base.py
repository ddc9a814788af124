"""The ``WorkflowStore`` contract.

The store owns time and every state transition. Each write that a worker makes under a
lease names the lease's fencing token; the store applies it only while that token still
holds an unexpired lease, and raises :class:`LeaseLostError` otherwise. Checkpoint
writes also name the revision they extend, so two writers can never interleave progress.
"""

from __future__ import annotations

import abc
from datetime import datetime, timedelta
from typing import Any

import attrs

from ..admission import TenantAdmission, TenantPolicy, explain
from ..models import LeaseDuration, TaskState, WorkerId, WorkflowTask
from .records import (
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
)


def _status(record: TaskRecord, now: datetime) -> str | None:
    """Where a queued or leased task without a recorded reason stands at ``now``."""
    if record.state is TaskState.LEASED and record.lease_expires is not None:
        lease = f"{record.worker_id} (fencing token {record.fencing_token})"
        if record.lease_expires <= now:
            return (
                f"lease of {lease} expired at {record.lease_expires.isoformat()}: claimable by another worker"
            )
        return f"running on {lease}, lease until {record.lease_expires.isoformat()}"
    if record.state is TaskState.QUEUED and record.ready_at is not None:
        if record.ready_at <= now:
            return f"ready since {record.ready_at.isoformat()}: waiting for a free worker"
        return f"scheduled: not claimable before {record.ready_at.isoformat()}"
    return None


class WorkflowStore(abc.ABC):
    """Semantic operations of the control plane. Implementations are thread-safe: the
    worker's heartbeat thread shares the store with the thread running steps."""

    # --- producers and operators -------------------------------------------------

    def enqueue(self, task: WorkflowTask) -> EnqueueResult:
        """Insert ``task``; an identical task with the same id is returned as it is, a
        different one raises :class:`EnqueueConflict`."""
        (result,) = self.enqueue_many([task])
        return result

    @abc.abstractmethod
    def enqueue_many(self, tasks: list[WorkflowTask]) -> list[EnqueueResult]:
        """Enqueue several tasks in one transaction: all of them or, on a conflict,
        none. Results are in the order of ``tasks``."""

    @abc.abstractmethod
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
        and requeue the task. The decision and who made it go into the history."""

    @abc.abstractmethod
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
        recorded in the task's history for operators). Refused with
        :class:`SignalRefused` (and recorded) for a finished task or a task at its cap of
        pending signals. Wakes the task if it waits for ``name``."""

    @abc.abstractmethod
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

        Completed external writes are not undone, except by declared compensations."""

    @abc.abstractmethod
    def requeue(self, task_id: str, *, actor: str, reason: str) -> None:
        """Operator retry: put a failed task back in the queue, its completed steps kept.
        A task failed on an ambiguous effect needs :meth:`resolve_effect` instead."""

    @abc.abstractmethod
    def get_task(self, task_id: str) -> TaskRecord: ...

    @abc.abstractmethod
    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        tenant: str | None = None,
        definition: str | None = None,
        limit: int = 100,
    ) -> list[TaskRecord]:
        """Tasks matching every given filter, oldest first."""

    @abc.abstractmethod
    def referenced_versions(self) -> list[VersionReference]:
        """Every definition version that unfinished or recoverable tasks reference: the
        versions a deploy must keep registered."""

    @abc.abstractmethod
    def queue_stats(self) -> list[QueueStats]: ...

    @abc.abstractmethod
    def history(self, task_id: str) -> list[TaskEvent]: ...

    # --- tenant admission ----------------------------------------------------------

    @abc.abstractmethod
    def set_tenant_policy(self, policy: TenantPolicy) -> None:
        """Store ``policy`` for its tenant, replacing any earlier one; claims on every
        worker apply it from their next claim."""

    @abc.abstractmethod
    def tenant_admission(self) -> list[TenantAdmission]:
        """Every tenant with a policy and where it stands now, by tenant name."""

    def explain_reasons(self, records: list[TaskRecord]) -> list[TaskRecord]:
        """``records`` with a ``status_note`` on every unfinished task that needs one: a
        ready task a claim skips for admission gets that hold, and a queued or leased
        task with no stored reason says whether it is due, scheduled or running where.
        ``reason`` stays what the store recorded."""
        unfinished = (TaskState.QUEUED, TaskState.WAITING, TaskState.LEASED)
        if not any(r.state in unfinished for r in records):
            return records
        admissions = {a.policy.tenant: a for a in self.tenant_admission()}
        now = self.now()
        explained = []
        for record in records:
            note = explain(record.state, record.ready_at, record.tenant, admissions)
            if note is None and record.reason is None and record.state in unfinished:
                note = _status(record, now)
            explained.append(record if note is None else attrs.evolve(record, status_note=note))
        return explained

    # --- workers -----------------------------------------------------------------

    @abc.abstractmethod
    def claim(self, worker_id: WorkerId, lease: LeaseDuration, *, limit: int = 1) -> list[ClaimedTask]:
        """Lease up to ``limit`` ready tasks (queued or waiting and due, or leased with an
        expired lease), raising each one's fencing token and claim count."""

    @abc.abstractmethod
    def heartbeat(self, lease: Lease, duration: LeaseDuration) -> Lease:
        """Extend a held lease from store now; raises LeaseLostError if it is not held."""

    @abc.abstractmethod
    def commit_checkpoint(self, lease: Lease, revision: int, checkpoint_json: str) -> Committed:
        """Store progress that extends ``revision``; returns the new revision and any
        pending cancel request."""

    @abc.abstractmethod
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
        """Move to ``waiting`` until ``wake_at`` (store time) or, with ``signal``, until a
        signal of that name arrives (at once if one is already pending). Refused with
        :class:`CancelPending` while a cancel is requested."""

    @abc.abstractmethod
    def pending_signals(self, task_id: str, name: str | None = None) -> list[Signal]:
        """Signals not yet consumed, oldest first: those named ``name``, or all of them
        when ``name`` is None (a wait reads them all, to refuse the names its definition
        does not declare)."""

    @abc.abstractmethod
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
        """Commit the checkpoint that records a wait's decision about a signal and mark
        the signal consumed, in one fenced write; returns what
        :meth:`commit_checkpoint` returns."""

    @abc.abstractmethod
    def acknowledge_cancel(self, lease: Lease, revision: int, checkpoint_json: str) -> None:
        """The worker stopped at a step boundary after a cancel request: end as cancelled."""

    @abc.abstractmethod
    def retry(
        self, lease: Lease, revision: int, checkpoint_json: str, *, delay: timedelta, reason: str
    ) -> datetime:
        """Requeue after ``delay`` counted from store now; returns when it is due.
        Refused with :class:`CancelPending` while a cancel is requested."""

    @abc.abstractmethod
    def release(self, lease: Lease, *, delay: timedelta, reason: str) -> None:
        """Hand the task back unchanged; the claim does not count as an attempt."""

    @abc.abstractmethod
    def complete(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str,
        result_json: str,
        *,
        then_claim: ClaimRequest | None = None,
    ) -> list[ClaimedTask]:
        """End the task completed; refused with :class:`CancelPending` while a cancel is
        requested (a cancel that reached the row first wins over the completion, even
        after the last step ran). With ``then_claim`` the same transaction then claims
        as :meth:`claim` would and returns what it leased: a worker that goes on working
        saves a commit per task. A refused completion (lease lost) claims nothing."""

    @abc.abstractmethod
    def fail(
        self,
        lease: Lease,
        revision: int,
        checkpoint_json: str | None,
        *,
        reason: str,
        ambiguous_effect: str | None = None,
    ) -> None:
        """End the task as failed. With ``ambiguous_effect`` (an effect key) the task is
        recoverable through :meth:`resolve_effect`."""

    @abc.abstractmethod
    def wait_for_work(self, timeout: timedelta) -> bool:
        """Block until a task is claimable (queued or waiting and due, or leased with an
        expired lease) or ``timeout`` has passed; True when work is claimable. A hint for
        idle workers, not a reservation: another worker may claim it first. PostgreSQL
        wakes on ``NOTIFY runifold_tasks`` and when the earliest timer comes due; SQLite,
        which has no notifications, polls."""

    # --- worker registry -----------------------------------------------------------

    @abc.abstractmethod
    def register_worker(
        self, worker_id: WorkerId, *, host: str, pid: int, definitions: list[tuple[str, int]]
    ) -> None:
        """Record a starting worker and the definition versions it serves."""

    @abc.abstractmethod
    def worker_seen(self, worker_id: WorkerId, pid: int) -> None:
        """Refresh ``last_seen`` of a running worker (its heartbeat thread calls this)."""

    @abc.abstractmethod
    def worker_stopped(self, worker_id: WorkerId, pid: int) -> None: ...

    @abc.abstractmethod
    def workers(self) -> list[WorkerRecord]: ...

    # --- time and lifecycle ------------------------------------------------------

    @abc.abstractmethod
    def now(self) -> datetime:
        """Store time, the only clock that decides expiry, timers and backoff."""

    @abc.abstractmethod
    def set_clock_offset(self, offset: timedelta) -> None:
        """Shift store time for every process using this database (tests and drills)."""

    @abc.abstractmethod
    def migrate(self) -> int:
        """Apply pending schema migrations (safe when several processes start at once);
        returns the schema version."""

    @abc.abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> WorkflowStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
