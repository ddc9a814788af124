"""``run_until_idle``: run a store's tasks in this process until none is left to claim,
and, with ``skip_time``, skip store time to each timer instead of waiting for it. The
testing kit (``runifold_sync.testing``, time skipped by default) and ``App.run_until_idle``
(not by default) share it.

A test of a workflow wants its end, not a worker pool: one ``WorkflowWorker`` calls
``run_once`` in a loop, so a step's exception, a print or a breakpoint happens in the
test itself, and every claim still goes through the store's fenced lease protocol, so
what passes here is what a pool does. A workflow that sleeps a day would make that test
wait a day; with ``skip_time`` the loop, once nothing is claimable, moves the store's
shared clock to the earliest due time (a timer, a wait's timeout, a retry's backoff) and
claims again, so a two-day approval timeout takes milliseconds.

It runs the tasks of every queue, as a pool serving them all would (``queues=`` narrows
it to those named): a task on a named queue is run, not left behind in silence.

What is never due by time stops the loop: a task waiting for a signal or an approval with
no timeout, a parent waiting for a child with none, a paused task, a task held by another
worker's lease, a tenant at its lease limit. The loop returns then and the test sends the
signal (``testing.send_signal``, ``testing.approve``) and calls it again; the signal wakes
the task, so the next call takes it. A tenant over its budget holds its tasks until its
charges leave the window: that is skipped to as a timer is. What would never run at all
raises :class:`NotIdle` naming it: a ready task whose definition version the registry
lacks, or has with other steps than the task's checkpoint was written by (a changed step
fingerprint), or a tenant whose budget nothing charged will ever free. ``max_cycles``
bounds a workflow that never ends (a loop of timers, a ``continue_as_new`` for ever) with
:class:`NotIdle` naming what is still unfinished, rather than a test that hangs.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

import attrs

from ..errors import InvalidArgument, RunifoldError
from ..model import validate
from ..model.outcomes import DefinitionUnavailable, Idle, RunOutcome
from ..model.values import LeaseDuration, TaskState, WorkerId
from ..store.base import WorkflowStore
from ..store.checks import MAX_LIST_LIMIT
from ..worker.worker import WorkflowWorker
from ..workflow.registry import WorkflowRegistry

DEFAULT_MAX_CYCLES = 10_000
DEFAULT_WORKER_ID = "runifold-testing"
# The lease of the kit's worker: cycles run in the test's thread, so it only has to
# outlast the longest step a test runs (the heartbeat extends it meanwhile).
_LEASE = LeaseDuration(timedelta(seconds=30))
_HEARTBEAT = timedelta(seconds=10)
# Unfinished tasks named in a NotIdle message; the rest are counted.
_NAMED = 20


@attrs.define(auto_exc=True, slots=False)
class NotIdle(RunifoldError):
    """``run_until_idle`` stopped before its store was idle: ``why``, the ids of the
    tasks still queued, waiting or leased (``unfinished``), and the outcomes of the
    cycles it ran (``outcomes``), so a test can see how far its workflow got."""

    why: str
    unfinished: tuple[str, ...]
    outcomes: tuple[RunOutcome, ...]

    def __str__(self) -> str:
        named = ", ".join(repr(t) for t in self.unfinished[:_NAMED])
        more = len(self.unfinished) - _NAMED
        tail = f" and {more} more" if more > 0 else ""
        return f"{self.why}; unfinished tasks: {named or 'none'}{tail}"


def run_until_idle(
    store: WorkflowStore,
    registry: WorkflowRegistry,
    *,
    skip_time: bool = True,
    max_cycles: int = DEFAULT_MAX_CYCLES,
    worker_id: str | WorkerId = DEFAULT_WORKER_ID,
    queues: Iterable[str] | None = None,
) -> list[RunOutcome]:
    """Run the tasks of ``store`` that ``registry`` serves until nothing is claimable;
    returns the outcome of every cycle that ran a task, in order (no ``Idle``). Tasks of
    every queue are run, those a run enqueues on a new queue too; ``queues`` (names)
    runs only theirs.

    With ``skip_time`` (the default), when nothing is claimable but a task that no
    worker holds becomes due later (a timer, a wait's timeout, a retry's backoff, a
    ``not_before``, its tenant's charges leaving the budget window), store time is moved
    forward to that moment and the loop goes on; without it, the loop returns as soon as
    nothing is claimable now. Either way it returns while tasks wait with no deadline (a
    signal, an approval or a child with no timeout): they are not claimable until the
    test sends what they wait for. Store time moved forward stays there, for every
    connection to the database (it is one clock).

    Raises :class:`NotIdle` after ``max_cycles`` claims, and at once when a ready task
    would never be run here: its definition version is not in ``registry``, or is with
    other steps than its checkpoint was written by, or its tenant's budget will never
    free it. Schedules' ticks are not created here (``run_once`` creates none); a test
    enqueues the task a tick would."""
    validate.flag("skip_time", skip_time)
    validate.count("max_cycles", max_cycles)
    ident = _worker_id(worker_id)
    chosen = None if queues is None else _queue_names(queues)
    serving = chosen or _queues_of(store)
    worker = _worker(store, registry, ident, serving)
    outcomes: list[RunOutcome] = []
    stalled = False  # the last empty claim already found work due that it could not take
    try:
        for _ in range(max_cycles):
            outcome = worker.run_once()
            if isinstance(outcome, DefinitionUnavailable):
                why = (
                    f"task {outcome.task_id!r} needs {outcome.name!r} version {outcome.version}, "
                    "which the registry lacks"
                )
                raise NotIdle(why, unfinished(store), (*outcomes, outcome))
            if not isinstance(outcome, Idle):
                outcomes.append(outcome)
                stalled = False
                continue
            found = serving if chosen is not None else _queues_of(store)
            if not set(found) <= set(serving):  # a task on a queue not served yet
                serving = tuple(sorted({*serving, *found}))
                worker.close()
                worker = _worker(store, registry, ident, serving)
                continue
            if not skip_time:
                return outcomes
            reading = store.clock_reading()
            next_due = reading.next_due if chosen is None else _next_due_on(store, chosen)
            if next_due is None:
                return outcomes
            if next_due <= reading.now:
                # Due but not claimed: a definition the registry lacks or has with other
                # steps (claims route around it), it fell due just after the claim (claim
                # again), or admission holds it back (the second time in a row).
                missing = _unserved(store, registry, serving, reading.now)
                if missing is not None:
                    raise NotIdle(missing, unfinished(store), tuple(outcomes))
                if not stalled:
                    stalled = True
                    continue
                frees = _budget_frees(store)
                if isinstance(frees, str):
                    raise NotIdle(frees, unfinished(store), tuple(outcomes))
                if frees is None:
                    return outcomes
                stalled = False
                store.set_clock_offset(reading.offset + (frees - reading.now))
                continue
            store.set_clock_offset(reading.offset + (next_due - reading.now))
    finally:
        worker.close()
    raise NotIdle(f"not idle after max_cycles={max_cycles} cycles", unfinished(store), tuple(outcomes))


def _worker(
    store: WorkflowStore, registry: WorkflowRegistry, worker_id: WorkerId, queues: tuple[str, ...]
) -> WorkflowWorker:
    return WorkflowWorker(store, registry, worker_id, _LEASE, _HEARTBEAT, queues=queues)


def _queue_names(queues: object) -> tuple[str, ...]:
    names = validate.names("queues", queues, kind="queue")
    if not names:
        raise InvalidArgument("queues must name at least one queue, got none")
    return tuple(sorted(names))


def _queues_of(store: WorkflowStore) -> tuple[str, ...]:
    """Every queue that holds an unfinished task (the default queue when none does)."""
    return tuple(sorted({backlog.queue for backlog in store.routed_backlog()})) or ("default",)


def _next_due_on(store: WorkflowStore, queues: tuple[str, ...]) -> datetime | None:
    """The earliest due time of a task on ``queues`` that no worker holds and nobody
    paused (``clock_reading().next_due`` of those queues alone), from the oldest
    10,000 queued and waiting tasks of each."""
    found = [
        record.ready_at
        for queue in queues
        for state in (TaskState.QUEUED, TaskState.WAITING)
        for record in store.list_tasks(state=state, queue=queue, limit=MAX_LIST_LIMIT)
        if record.ready_at is not None and not record.paused
    ]
    return min(found, default=None)


def _unserved(
    store: WorkflowStore, registry: WorkflowRegistry, queues: tuple[str, ...], now: datetime
) -> str | None:
    """Why a task due on ``queues`` will never be claimed here: its definition is not in
    ``registry``, or is with other steps than its checkpoint was written by."""
    for state in (TaskState.QUEUED, TaskState.WAITING):
        for record in store.list_tasks(state=state):
            due = record.ready_at is not None and record.ready_at <= now and not record.paused
            if not due or record.queue not in queues:
                continue
            name, version = record.definition_name, record.definition_version
            definition = registry.get(name, version)
            if definition is None:
                return f"task {record.task_id!r} needs {name!r} version {version}, which the registry lacks"
            registered = definition.identity.fingerprint
            if record.fingerprint is not None and record.fingerprint != registered:
                return (
                    f"task {record.task_id!r} was checkpointed by {name!r} version {version} with "
                    f"step fingerprint {record.fingerprint}, but the registry's has fingerprint "
                    f"{registered}: its steps changed under the same version (give the changed "
                    "definition a new version, and keep the old one registered for its tasks)"
                )
    return None


def _budget_frees(store: WorkflowStore) -> datetime | str | None:
    """When store time frees the first tenant whose budget holds back ready tasks (its
    oldest charge leaves the window), why nothing ever will for one (it charged nothing
    the window could lose), or None when no budget holds tasks back."""
    frees: list[datetime] = []
    for admission in store.tenant_admission():
        budget = admission.policy.budget
        if budget is None or not admission.over_budget or not admission.ready:
            continue
        if admission.oldest_charge_at is None:
            return f"{admission.ready} ready task(s) held for good: {admission.hold_reason()}"
        frees.append(admission.oldest_charge_at + budget.window)
    return min(frees, default=None)


def unfinished(store: WorkflowStore) -> tuple[str, ...]:
    """The ids of the tasks of ``store`` still queued, waiting or leased (up to 100 of
    each), oldest first within each state."""
    states = (TaskState.QUEUED, TaskState.WAITING, TaskState.LEASED)
    return tuple(record.task_id for state in states for record in store.list_tasks(state=state))


def _worker_id(value: object) -> WorkerId:
    if isinstance(value, WorkerId):
        return value
    if isinstance(value, str):
        return WorkerId.parse(value)
    validate.refuse("worker_id", "a string or a WorkerId", value)
