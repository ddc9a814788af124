"""The values the store hands out and takes in: leases, claimed tasks, task snapshots,
history events, signals and the registry's rows.

They are plain frozen attrs classes with no behaviour beyond decoding their JSON text, so
any module (the worker, the CLI, the tests) can use them without reaching the store
contract in :mod:`.base`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

import attrs

from ..errors import CancelPending, InvalidArgument, LeaseLostError
from ..model import validate
from ..model.checkpoint import JournalRow
from ..model.codec import from_json
from ..model.values import LeaseDuration, TaskOutcome, TaskState, WorkerId


@attrs.frozen
class Lease:
    """Proof of ownership. Writes carry ``fencing_token``; a newer claim has a higher one."""

    task_id: str
    tenant: str
    worker_id: str
    fencing_token: int
    expires_at: datetime
    cancel_requested: str | None = None  # set by a heartbeat after store.cancel()
    paused: str | None = None  # set by a heartbeat after store.pause()


@attrs.frozen
class Committed:
    """A fenced checkpoint write: the new revision, and the cancel request and pause the
    task row held when it committed. Every step boundary commits, so a worker learns of
    either at its next boundary even when no heartbeat has come round yet. No field has
    a default: every fenced commit says both (``sql_transitions.fenced_commit``)."""

    revision: int
    cancel_requested: str | None
    paused: str | None  # store.pause() reached the task: it parks at this boundary


@attrs.frozen
class Route:
    """One (queue, definition name, version) a worker claims from, with the step
    fingerprint its registry has for that version."""

    queue: str
    name: str
    version: int
    fingerprint: str


@attrs.frozen
class Routes:
    """What a worker can run: the queues it claims from and the (name, version,
    fingerprint) of each definition its registry serves. A claim with routes takes only
    tasks of those queues and versions whose head, if they have one, was written by that
    fingerprint; the idle wait looks only at their due times."""

    queues: tuple[str, ...]
    definitions: tuple[tuple[str, int, str], ...]

    @classmethod
    def serving(cls, queues: Iterable[str], definitions: Iterable[tuple[str, int, str]]) -> Routes:
        """Checked: at least one queue, each a name."""
        if isinstance(queues, str):
            raise InvalidArgument(f"queues must be a sequence of queue names, got the string {queues!r}")
        checked = tuple(validate.name("queue", q) for q in queues)
        if not checked:
            raise InvalidArgument("a worker needs at least one queue")
        return cls(checked, tuple((str(n), int(v), str(f)) for n, v, f in definitions))

    @property
    def routes(self) -> tuple[Route, ...]:
        """Every (queue, definition) pair, in a fixed order."""
        return tuple(
            Route(queue, name, version, fingerprint)
            for queue in sorted(set(self.queues))
            for name, version, fingerprint in sorted(set(self.definitions))
        )


@attrs.frozen
class ClaimRequest:
    """A claim to make in the same transaction as a completion (see
    :meth:`WorkflowStore.complete`): what ``claim(worker_id, lease, limit=limit,
    routes=routes)`` takes. ``routes`` None claims any task (tools and tests)."""

    worker_id: WorkerId
    lease: LeaseDuration
    limit: int = 1
    routes: Routes | None = None


@attrs.frozen
class Completion:
    """One task's completion in :meth:`WorkflowStore.complete_batch`: what
    :meth:`WorkflowStore.complete` takes for it."""

    lease: Lease
    revision: int
    checkpoint_json: str
    result_json: str
    journal: tuple[JournalRow, ...] = ()


@attrs.frozen
class BatchCompleted:
    """What :meth:`WorkflowStore.complete_batch` did: the completions it refused, each
    task id with the error its own ``complete`` would have raised
    (:class:`~runifold_sync.errors.CancelPending` or
    :class:`~runifold_sync.errors.LeaseLostError`), and the tasks its claim leased."""

    refused: dict[str, CancelPending | LeaseLostError]
    claimed: list[ClaimedTask]


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


class SignalCheck(enum.StrEnum):
    """How much of a signal the store could check when it kept it. What is left is
    checked by the wait that takes it, which records a refusal in the task's history."""

    # The task waits for this signal now: its name was checked and, for an approval, that
    # the sender is an approver and the payload a decision. The definition's sender policy
    # and payload type are still the wait's to apply.
    WAITING = "waiting"
    # The name is declared by the task's definition; sender and payload are checked by
    # the wait that takes it.
    DECLARED = "declared"
    # No registry has told the store the task's definition yet (it was enqueued without
    # one and no worker serving it has started): nothing is validated until its wait.
    UNCHECKED = "unchecked"


@attrs.frozen
class SignalDelivery:
    signal_id: str
    created: bool  # False when this signal id was delivered before with the same content
    # What was checked of a new delivery; None for a redelivery, which stores nothing.
    checked: SignalCheck | None = None


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
    trace_context: str | None = None  # W3C traceparent current at enqueue (trace_context.py)

    @property
    def queue_delay(self) -> timedelta:
        return max(self.claimed_at - self.due_at, timedelta(0))


@attrs.frozen
class EnqueueResult:
    task_id: str
    created: bool


@attrs.frozen
class TaskRecord:
    """A snapshot of one task row. ``reason`` is what the store recorded: why an
    unfinished task is not running, or why a failed one failed. ``status_note`` is
    derived when the task is read (:meth:`WorkflowStore.explain_reasons`): where an
    unfinished task stands now, such as a tenant limit holding it back or the worker
    running it; None for a finished task."""

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
    parent_id: str | None = None  # the task that started this one (ctx.start_child)
    waiting_for_child: str | None = None  # the child a waiting task waits for
    paused: str | None = None  # who paused it and why (store.pause), None when not paused
    queue: str = "default"  # the named queue it was enqueued on
    # The step fingerprint its head is written by (set when a claim took it without a
    # head): only a worker with that fingerprint claims it. None before its first claim.
    fingerprint: str | None = None
    # Signals refused where they were sent (send_signal); the history records the first
    # ``refusals.RECORDED_SIGNAL_REFUSALS`` of them, and only counts the rest here.
    refused_signals: int = 0
    detached: bool = False  # a child its parent's cancel does not cancel (start_child(detached=True))
    status_note: str | None = None
    # The group its flow limits count it in (model.flow), and its dedup and debounce keys.
    concurrency_key: str | None = None
    dedup_key: str | None = None
    debounce_key: str | None = None

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
    # The step fingerprints its checkpointed tasks were written by (sorted); a worker whose
    # definition has another fingerprint cannot resume them.
    fingerprints: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.queued + self.leased + self.waiting + self.recoverable


@attrs.frozen
class RoutedBacklog:
    """Unfinished tasks of one queue and definition version whose heads (if any) were
    written by ``fingerprint`` (None: no claim has given them one); ``ready`` of them are
    queued, due and not paused: a worker that serves them would claim them now."""

    queue: str
    name: str
    version: int
    fingerprint: str | None
    tasks: int
    ready: int = 0


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
    # The step fingerprint it registered for each (name, version); none from a worker of
    # a release that did not record them.
    fingerprints: dict[tuple[str, int], str] = attrs.Factory(dict)
    # The queues it claims from (a worker of a release without queues served "default").
    queues: tuple[str, ...] = ("default",)

    def live(self, within: timedelta) -> bool:
        return self.stopped_at is None and self.silent_s <= within.total_seconds()

    def serves(self, queue: str, name: str, version: int, fingerprint: str | None = None) -> bool:
        """Whether this worker claims tasks of ``queue`` for ``name`` ``version`` (whose
        head ``fingerprint`` wrote, when given)."""
        if queue not in self.queues or (name, version) not in self.definitions:
            return False
        registered = self.fingerprints.get((name, version))
        return fingerprint is None or registered is None or registered == fingerprint


def unserved_reason(
    queue: str, name: str, version: int, fingerprint: str | None, live: list[WorkerRecord]
) -> str | None:
    """Why no worker in ``live`` can claim a task of ``queue`` for ``name`` ``version``
    whose head ``fingerprint`` wrote (None: any), or None when one can."""
    if any(w.serves(queue, name, version, fingerprint) for w in live):
        return None
    if not any(queue in w.queues for w in live):
        return f"no live worker serves queue {queue!r}"
    if not any(w.serves(queue, name, version) for w in live):
        return f"no live worker serves {name!r} version {version} in queue {queue!r}"
    return (
        f"no live worker serves {name!r} version {version} with step fingerprint {fingerprint} "
        f"(the steps its checkpoint was written by) in queue {queue!r}"
    )


@attrs.frozen
class PublishedEvent:
    """The value a workflow last published under ``key`` (``ctx.set_event``), and the
    store time of the commit that set it."""

    task_id: str
    key: str
    value_json: str
    set_at: datetime

    @property
    def value(self) -> Any:
        return from_json(self.value_json)


@attrs.frozen
class ClockReading:
    """Store time, the shared clock offset that tests move it by (absolute, as
    ``set_clock_offset`` takes it), and the earliest time a task that no worker holds
    and nobody paused becomes claimable (a timer, a wait's timeout, a retry's backoff;
    None when no such task has one), read in one statement so the three agree."""

    now: datetime
    offset: timedelta
    next_due: datetime | None


@attrs.frozen
class TaskPage:
    """One page of tasks in creation order, and the cursor of the page after it (None
    on the last page): what :meth:`WorkflowStore.list_tasks_page` returns."""

    tasks: list[TaskRecord]
    next_after: str | None


@attrs.frozen
class FinishedInterval:
    """How many tasks finished (completed, failed, cancelled) in the interval that
    starts at ``start``."""

    start: datetime
    completed: int = 0
    failed: int = 0
    cancelled: int = 0

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.cancelled


@attrs.frozen
class StreamWrite:
    """One ``ctx.write_stream``: ``value_json`` for stream ``key``, and its place in the
    run that wrote it (``run``; ``writer``: '' for the main function; ``seq``: that
    writer's n-th write to ``key`` in the run), which makes writing it again a no-op."""

    key: str
    value_json: str
    run: int
    writer: str
    seq: int

    def place(self) -> dict[str, Any]:
        return {"key": self.key, "run": self.run, "writer": self.writer, "seq": self.seq}


@attrs.frozen
class StreamValue:
    """A value of a task's stream, at ``position`` (1, 2, ...: what ``after=`` takes)."""

    position: int
    value: Any


@attrs.frozen
class StreamRead:
    """What ``store.read_stream`` found: the values after the offset asked for, in
    order, and whether the stream is ``closed`` (the task has finished, so nothing
    follows ``values``). ``next_after`` is what to pass as ``after=`` next."""

    values: list[StreamValue]
    closed: bool
    next_after: int
