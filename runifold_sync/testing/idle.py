"""``run_until_idle``: run a store's tasks in the test's own process until none is left to
claim, skipping store time to each timer instead of waiting for it.

A test of a workflow wants its end, not a worker pool: one ``WorkflowWorker`` calls
``run_once`` in a loop, so a step's exception, a print or a breakpoint happens in the
test itself, and every claim still goes through the store's fenced lease protocol, so
what passes here is what a pool does. A workflow that sleeps a day would make that test
wait a day; with ``skip_time`` the loop, once nothing is claimable, moves the store's
shared clock to the earliest due time (a timer, a wait's timeout, a retry's backoff) and
claims again, so a two-day approval timeout takes milliseconds.

What is never due by time stops the loop: a task waiting for a signal or an approval with
no timeout, a parent waiting for a child with none, a paused task, a task held by another
worker's lease, work tenant admission holds back. The loop returns then and the test
sends the signal (``testing.send_signal``, ``testing.approve``) and calls it again; the
signal wakes the task, so the next call takes it. ``max_cycles`` bounds a workflow that
never ends (a loop of timers, a ``continue_as_new`` for ever) with :class:`NotIdle`
naming what is still unfinished, rather than a test that hangs.
"""

from __future__ import annotations

from datetime import timedelta

import attrs

from ..definition import WorkflowRegistry
from ..errors import InvalidArgument, RunifoldError
from ..models import LeaseDuration, TaskState, WorkerId, check_count
from ..outcomes import DefinitionUnavailable, Idle, RunOutcome
from ..store.base import WorkflowStore
from ..worker import WorkflowWorker

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
) -> list[RunOutcome]:
    """Run the tasks of ``store`` that ``registry`` serves until nothing is claimable;
    returns the outcome of every cycle that ran a task, in order (no ``Idle``).

    With ``skip_time`` (the default), when nothing is claimable but a task that no
    worker holds becomes due later (a timer, a wait's timeout, a retry's backoff, a
    ``not_before``), store time is moved forward to that moment and the loop goes on;
    without it, the loop returns as soon as nothing is claimable now. Either way it
    returns while tasks wait with no deadline (a signal, an approval or a child with no
    timeout): they are not claimable until the test sends what they wait for. Store time
    moved forward stays there, for every connection to the database (it is one clock).

    Raises :class:`NotIdle` after ``max_cycles`` claims, and at once when a task needs a
    definition ``registry`` lacks (it would be handed back and claimed again forever).
    Schedules' ticks are not created here (``run_once`` creates none); a test enqueues
    the task a tick would."""
    if not isinstance(skip_time, bool):
        raise InvalidArgument(f"skip_time must be True or False, got {skip_time!r}")
    check_count("max_cycles", max_cycles)
    worker = WorkflowWorker(store, registry, _worker_id(worker_id), _LEASE, _HEARTBEAT)
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
            if not skip_time:
                return outcomes
            reading = store.clock_reading()
            if reading.next_due is None:
                return outcomes
            if reading.next_due <= reading.now:
                # Due but not claimed: a definition the registry lacks (claims route
                # around it), it fell due just after the claim (claim again), or
                # admission holds it back (the second time in a row: stop).
                missing = _unserved(store, registry)
                if missing is not None:
                    raise NotIdle(missing, unfinished(store), tuple(outcomes))
                if stalled:
                    return outcomes
                stalled = True
                continue
            store.set_clock_offset(reading.offset + (reading.next_due - reading.now))
    finally:
        worker.close()
    raise NotIdle(f"not idle after max_cycles={max_cycles} cycles", unfinished(store), tuple(outcomes))


def _unserved(store: WorkflowStore, registry: WorkflowRegistry) -> str | None:
    """Why a due task will never be claimed here: its definition is not in ``registry``."""
    for state in (TaskState.QUEUED, TaskState.WAITING):
        for record in store.list_tasks(state=state):
            if registry.get(record.definition_name, record.definition_version) is None:
                return (
                    f"task {record.task_id!r} needs {record.definition_name!r} version "
                    f"{record.definition_version}, which the registry lacks"
                )
    return None


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
    raise InvalidArgument(f"worker_id must be a string or a WorkerId, got {value!r}")
