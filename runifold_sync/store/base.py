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
from ..codec import from_json
from ..models import LeaseDuration, TaskOutcome, TaskState, WorkerId, WorkflowTask


@attrs.frozen
class Lease:
    """Proof of ownership. Writes carry ``fencing_token``; a newer claim has a higher one."""

    task_id: str
    tenant: str
    worker_id: str
    fencing_token: int
    expires_at: datetime
    cancel_requested: str | None = None  # set by a heartbeat after store.cancel()


@attrs.frozen
class Committed:
    """A fenced checkpoint write: the new revision, and the cancel request the task row
    held when it committed. Every step boundary commits, so a worker learns of a cancel
    at its next boundary even when no heartbeat has come round yet."""

    revision: int
    cancel_requested: str | None = None


@attrs.frozen
class ClaimRequest:
    """A claim to make in the same transaction as a completion (see
    :meth:`WorkflowStore.complete`): what ``claim(worker_id, lease, limit=limit)`` takes."""

    worker_id: WorkerId
    lease: LeaseDuration
    limit: int = 1


@attrs.frozen
class EffectResolution:
    """An operator's or application's audited decision about an ambiguous effect."""

    key: str
    applied: bool
    result_json: str | None
    actor: str
    reason: str


@attrs.frozen
class Signal:
    """A delivery to a task, kept until a wait consumes or refuses it."""

    signal_id: str
    name: str
    payload_json: str
    sender: str
    reason: str | None
    sent_at: datetime

    @property
    def payload(self) -> Any:
        return from_json(self.payload_json)


@attrs.frozen
class SignalDelivery:
    signal_id: str
    created: bool  # False when this signal id was delivered before with the same content


@attrs.frozen
class ClaimedTask:
    """A leased task. ``due_at`` is when it became claimable and ``claimed_at`` when this
    claim happened (both store time), so ``claimed_at - due_at`` is its queue delay;
    ``from_state`` is ``queued``, ``waiting`` (resumed) or ``leased`` (taken over)."""

    lease: Lease
    definition_name: str
    definition_version: int
    input_json: str
    revision: int
    checkpoint_json: str | None
    claims_since_progress: int
    resolutions: dict[str, EffectResolution]
    due_at: datetime
    claimed_at: datetime
    from_state: str
    wait_started_at: datetime | None = None  # resumed from a wait: when it began
    wait_kind: str | None = None  # "timer" or "signal"

    @property
    def queue_delay(self) -> timedelta:
        return max(self.claimed_at - self.due_at, timedelta(0))


@attrs.frozen
class EnqueueResult:
    task_id: str
    created: bool


@attrs.frozen
class TaskRecord:
    """A snapshot of one task row; ``reason`` says why an unfinished task is not running
    (or why a failed one failed)."""

    task_id: str
    definition_name: str
    definition_version: int
    tenant: str
    input_json: str
    priority: int
    state: TaskState
    outcome: TaskOutcome | None
    reason: str | None
    ambiguous_effect: str | None
    ready_at: datetime | None
    worker_id: str | None
    fencing_token: int
    lease_expires: datetime | None
    claims_since_progress: int
    revision: int
    checkpoint_json: str | None
    result_json: str | None
    created_at: datetime
    updated_at: datetime

    @property
    def input(self) -> Any:
        return from_json(self.input_json)

    @property
    def result(self) -> Any:
        return None if self.result_json is None else from_json(self.result_json)


@attrs.frozen
class TaskEvent:
    """One transition in a task's history, stamped with store time."""

    event_id: int
    task_id: str
    at: datetime
    kind: str
    worker_id: str | None
    fencing_token: int | None
    detail: dict[str, Any]


@attrs.frozen
class VersionReference:
    """A definition version still needed: tasks that are queued, leased, waiting or
    recoverable (failed on an ambiguous effect) reference it."""

    name: str
    version: int
    queued: int
    leased: int
    waiting: int
    recoverable: int

    @property
    def total(self) -> int:
        return self.queued + self.leased + self.waiting + self.recoverable


@attrs.frozen
class QueueStats:
    """Task counts per tenant, state and outcome. ``oldest_ready_age_s`` is how long the
    longest-ready queued task has waited for a claim (queue delay), None when none waits."""

    tenant: str
    state: TaskState
    outcome: TaskOutcome | None
    count: int
    oldest_ready_age_s: float | None


@attrs.frozen
class WorkerRecord:
    """A registered worker. ``silent_s`` is store time since it was last seen; a worker
    is live when that is short and it has not stopped."""

    worker_id: str
    host: str
    pid: int
    started_at: datetime
    last_seen: datetime
    stopped_at: datetime | None
    definitions: list[tuple[str, int]]
    silent_s: float

    def live(self, within: timedelta) -> bool:
        return self.stopped_at is None and self.silent_s <= within.total_seconds()


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
        """``records`` with a reason on every unfinished task: a ready task a claim skips
        for admission gets that reason (the stored one kept after it), and a queued or
        leased task without one says whether it is due, scheduled or running where."""
        unfinished = (TaskState.QUEUED, TaskState.WAITING, TaskState.LEASED)
        if not any(r.state in unfinished for r in records):
            return records
        admissions = {a.policy.tenant: a for a in self.tenant_admission()}
        now = self.now()
        explained = []
        for record in records:
            hold = explain(record.state, record.ready_at, record.tenant, admissions)
            if hold is not None:
                reason = hold if record.reason is None else f"{hold}; before that: {record.reason}"
                record = attrs.evolve(record, reason=reason)
            elif record.reason is None and record.state in unfinished:
                record = attrs.evolve(record, reason=_status(record, now))
            explained.append(record)
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
