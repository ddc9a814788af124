"""``ctx.wait_any`` on every backend, run by real workers over real stores: the first of
several children, signal names and timers.

- the store wakes a task waiting for several children (or names) for any of them, and
  the wait returns which fired (index, item) and its value: a child's result (or its
  ``ChildFailed``, returned), a signal's payload and name, None for a timer;
- what fired is committed before the call returns and replayed after; the others are left
  as they were (a signal stays pending, a child runs on);
- a sliding window of children keeps N in flight without waiting for the oldest;
- bad items are refused at the call.

(The crash points around what fired are in ``tests/system/test_verb_crash_points.py``.)
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import ChildFailed
from runifold_sync.outcomes import Completed, Failed, Idle, Suspended
from runifold_sync.workflow.waiting import ChildHandle, Fired
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.journals import entries

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))

job = Workflow("job", 1, signals=["finish"])


@job.main
def job_main(ctx: WorkflowContext, order: str) -> str:
    if order.startswith("slow"):
        ctx.wait_for_signal("finish")
    if order.startswith("bad"):
        raise ValueError(f"cannot do {order}")
    return f"did {order}"


race = Workflow("first-of", 1, signals=["stop"])


def _shown(fired: Fired) -> dict[str, Any]:
    item = fired.item.task_id if isinstance(fired.item, ChildHandle) else str(fired.item)
    value = f"failed: {fired.value.child_id}" if isinstance(fired.value, ChildFailed) else fired.value
    return {"index": fired.index, "item": item, "value": value, "name": fired.name}


@race.main
def race_main(ctx: WorkflowContext, orders: list[str]) -> dict[str, Any]:
    handles = [ctx.start_child("job", 1, order) for order in orders]
    fired = ctx.wait_any(["stop", *handles, timedelta(hours=1)])
    ctx.sleep(timedelta(minutes=1))  # what fired is replayed on the next claim
    return _shown(fired)


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    for workflow in (job, race, window):
        reg.register(WorkflowDefinition(workflow))
    return reg


def run_until_idle(store: WorkflowStore, worker_id: str = "w1") -> list[Any]:
    worker = WorkflowWorker(store, registry(), WorkerId.parse(worker_id), LEASE, timedelta(seconds=5))
    outcomes: list[Any] = []
    try:
        while not isinstance(outcome := worker.run_once(), Idle):
            outcomes.append(outcome)
    finally:
        worker.close()
    return outcomes


def _finish(store: WorkflowStore, clock: Clock) -> Any:
    clock.advance(timedelta(minutes=2))
    run_until_idle(store, "w-end")
    return store.get_task("p")


def test_the_first_child_to_end_fires_and_is_replayed(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("first-of", 1, ["slow-a", "fast-b"], checkpoint_id="p"))
    outcomes = run_until_idle(store)
    # The parent waited for both children; fast-b ended and woke it; it fired and slept.
    assert [o.task_id for o in outcomes if isinstance(o, Completed)] == ["p:child:job-2"]
    reason = store.get_task("p").reason
    assert reason is not None and reason.startswith("waiting for timer timer#1 until ")
    fired = [e for e in entries(store, "p") if e["kind"] == "any"]
    assert [(e["call_id"], e["status"], e["output"]["index"]) for e in fired] == [("any#1", "done", 2)]
    record = _finish(store, clock)
    assert record.result == {"index": 2, "item": "p:child:job-2", "value": "did fast-b", "name": None}
    assert store.get_task("p:child:job-1").state.value == "waiting"  # the other child runs on


def test_a_failed_child_is_returned_as_child_failed(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("first-of", 1, ["slow-a", "bad-b"], checkpoint_id="p"))
    run_until_idle(store)
    assert _finish(store, clock).result == {
        "index": 2,
        "item": "p:child:job-2",
        "value": "failed: p:child:job-2",
        "name": None,
    }


def test_a_signal_fires_and_wakes_the_task(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("first-of", 1, ["slow-a"], checkpoint_id="p"))
    run_until_idle(store)
    assert store.get_task("p").reason == "waiting for the first of stop, p:child:job-1, 1:00:00"
    store.send_signal("p", "stop", {"why": "enough"}, signal_id="s1", sender="ops")
    task = store.get_task("p")
    assert task.ready_at is not None and task.ready_at <= store.now()
    run_until_idle(store, "w2")
    assert _finish(store, clock).result == {
        "index": 0,
        "item": "stop",
        "value": {"why": "enough"},
        "name": "stop",
    }


def test_the_timer_fires_when_nothing_else_did(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("first-of", 1, ["slow-a"], checkpoint_id="p"))
    run_until_idle(store)
    outcome_due = store.get_task("p").ready_at
    assert outcome_due is not None and outcome_due - store.now() > timedelta(minutes=59)
    clock.advance(timedelta(hours=1, minutes=1))
    run_until_idle(store, "w2")
    assert _finish(store, clock).result == {"index": 2, "item": "1:00:00", "value": None, "name": None}


# --- a sliding window ---------------------------------------------------------------------

window = Workflow("window", 1)
IN_FLIGHT = 2


@window.main
def window_main(ctx: WorkflowContext, orders: list[str]) -> dict[str, Any]:
    pending: list[ChildHandle] = []
    done: list[str] = []
    most = 0
    for order in orders:
        if len(pending) == IN_FLIGHT:  # a slot frees as soon as any child ends, not the oldest
            fired = ctx.wait_any(pending)
            done.append(fired.value)
            pending.pop(fired.index)
        pending.append(ctx.start_child("job", 1, order))
        most = max(most, len(pending))
    while pending:
        fired = ctx.wait_any(pending)
        done.append(fired.value)
        pending.pop(fired.index)
    return {"done": done, "most in flight": most}


def test_a_sliding_window_keeps_n_children_in_flight(backend: Backend) -> None:
    store = backend.open()
    orders = ["slow-1", "b", "c", "d", "e"]
    store.enqueue(WorkflowTask.new("window", 1, orders, checkpoint_id="p"))
    run_until_idle(store)
    # slow-1 still runs, yet the window moved on past it: b, c, d and e are done.
    task = store.get_task("p")
    assert task.state.value == "waiting", task.reason
    store.send_signal("p:child:job-1", "finish", None, signal_id="f", sender="ops")
    run_until_idle(store, "w2")
    record = store.get_task("p")
    assert record.result == {"done": ["did b", "did c", "did d", "did e", "did slow-1"], "most in flight": 2}


# --- bad input ----------------------------------------------------------------------------

bad = Workflow("bad-any", 1, signals=["stop"])


@bad.main
def bad_main(ctx: WorkflowContext, case: str) -> Any:
    items: Any = {"empty": [], "twice": ["stop", "stop"], "number": [3], "negative": [timedelta(-1)]}[case]
    return ctx.wait_any(items)


def test_bad_items_are_refused_at_the_call(backend: Backend) -> None:
    store = backend.open()
    expected = {
        "empty": "wait_any items must be a non-empty list of child handles, signal names and timers "
        "(timedelta or datetime), got []",
        "twice": "wait_any items must be distinct, got ['stop', 'stop']",
        "number": "wait_any item must be a child handle, a signal name, a timedelta or a datetime, got 3",
        "negative": "wait_any timer must be positive, got datetime.timedelta(days=-1)",
    }
    for case in expected:
        store.enqueue(WorkflowTask.new("bad-any", 1, case, checkpoint_id=case))
    worker = WorkflowWorker(store, _bad_registry(), WorkerId.parse("w1"), LEASE, timedelta(seconds=5))
    try:
        outcomes = {o.task_id: o for o in (worker.run_once() for _ in expected)}
    finally:
        worker.close()
    for case, message in expected.items():
        outcome = outcomes[case]
        assert isinstance(outcome, Failed) and message in outcome.reason, outcome
        assert not isinstance(outcome, Suspended)


def _bad_registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(bad))
    return reg
