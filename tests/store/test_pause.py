"""Pause and resume on each store: a paused task is never claimed, says who paused it and
why, keeps what came meanwhile (a timer falling due, a signal), and a running task parks
at its next step boundary. Both actions are audited in the history.

Each cycle runs on a new worker, so nothing comes from an earlier worker's memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.errors import InvalidArgument, InvalidState, TaskNotFound
from runifold_sync.outcomes import Completed, Idle, Suspended
from runifold_sync.store import TaskState
from runifold_sync.store.records import ClaimedTask, Committed
from tests.support.backends import contract_backend
from tests.support.clock import Clock
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
RAN: list[str] = []
STORES: list[WorkflowStore] = []  # the store a step pauses its own task through


@pytest.fixture(autouse=True)
def _fresh_records(store: WorkflowStore) -> Iterator[None]:
    RAN.clear()
    STORES[:] = [store]
    yield
    RAN.clear()
    STORES.clear()


flow = Workflow("pausable", 1, signals=["go"])


@flow.step()
def first(ctx: StepContext, mode: str) -> str:
    RAN.append("first")
    if mode in ("pause-myself", "pause-then-event"):  # an operator's pause landing while it runs
        STORES[0].pause(ctx.task_id, actor="alice", reason="while running")
    return "first"


@flow.step()
def second(ctx: StepContext, mode: str) -> str:
    RAN.append("second")
    return "second"


@flow.main
def main(ctx: WorkflowContext, mode: str) -> Any:
    first(ctx, mode)
    if mode == "pause-then-event":  # first's result is committed with the event, not before
        ctx.set_event("stage", "first done")
    got = None
    if mode == "timer":
        ctx.sleep(timedelta(minutes=5))
    if mode == "signal":
        got = ctx.wait_for_signal("go")
    second(ctx, mode)
    return {"mode": mode, "signal": got}


def _cycle(store: WorkflowStore) -> Any:
    return run_cycle(store, WorkflowDefinition(flow))


def _enqueue(store: WorkflowStore, mode: str) -> None:
    store.enqueue(WorkflowTask.new("pausable", 1, mode, checkpoint_id="t1"))


def test_a_paused_queued_task_is_not_claimed_until_resumed(store: WorkflowStore) -> None:
    _enqueue(store, "plain")
    assert store.pause("t1", actor="alice", reason="maintenance") is TaskState.QUEUED
    record = store.get_task("t1")
    assert (record.state, record.paused, record.reason) == (
        TaskState.QUEUED,
        "paused by alice: maintenance",
        "paused by alice: maintenance",
    )
    assert _cycle(store) == Idle()
    assert store.resume("t1", actor="bob", reason="done") is TaskState.QUEUED
    assert store.get_task("t1").paused is None
    assert _cycle(store) == Completed("t1", {"mode": "plain", "signal": None})
    audit = [(e.kind, e.detail.get("actor"), e.detail.get("reason")) for e in store.history("t1")]
    assert ("paused", "alice", "maintenance") in audit and ("resumed", "bob", "done") in audit


def test_a_timer_that_fell_due_while_paused_fires_on_resume(store: WorkflowStore, clock: Clock) -> None:
    _enqueue(store, "timer")
    assert isinstance(_cycle(store), Suspended)
    assert store.pause("t1", actor="alice", reason="hold") is TaskState.WAITING
    clock.advance(timedelta(minutes=6))  # the timer is due, but the task is paused
    assert _cycle(store) == Idle()
    store.resume("t1", actor="alice", reason="go on")
    assert _cycle(store) == Completed("t1", {"mode": "timer", "signal": None})
    assert RAN == ["first", "second"]


def test_a_resumed_task_whose_timer_is_not_due_waits_for_it_again(store: WorkflowStore, clock: Clock) -> None:
    _enqueue(store, "timer")
    _cycle(store)
    store.pause("t1", actor="alice", reason="hold")
    store.resume("t1", actor="alice", reason="go on")
    assert isinstance(_cycle(store), Suspended)  # replayed, and the timer still runs
    clock.advance(timedelta(minutes=6))
    assert _cycle(store) == Completed("t1", {"mode": "timer", "signal": None})


def test_a_signal_sent_while_paused_is_kept_for_the_task(store: WorkflowStore) -> None:
    _enqueue(store, "signal")
    assert isinstance(_cycle(store), Suspended)
    store.pause("t1", actor="alice", reason="hold")
    store.send_signal("t1", "go", {"n": 1}, signal_id="s1", sender="bob")
    assert _cycle(store) == Idle()  # the signal woke it, but it is paused
    store.resume("t1", actor="alice", reason="go on")
    assert _cycle(store) == Completed("t1", {"mode": "signal", "signal": {"n": 1}})


def test_a_running_task_parks_at_its_next_step_boundary(store: WorkflowStore) -> None:
    _enqueue(store, "pause-myself")
    outcome = _cycle(store)
    assert isinstance(outcome, Suspended) and outcome.reason == "paused at a step boundary"
    parked = store.get_task("t1")
    assert (parked.state, parked.reason) == (TaskState.WAITING, "paused by alice: while running")
    assert RAN == ["first"]  # second did not start
    assert _cycle(store) == Idle()
    assert store.resume("t1", actor="alice", reason="go on") is TaskState.WAITING
    assert _cycle(store) == Completed("t1", {"mode": "pause-myself", "signal": None})
    assert RAN == ["first", "second"]  # first was not run again


def test_a_pause_that_lands_with_an_event_commit_parks_the_task_at_that_boundary(
    store: WorkflowStore,
) -> None:
    _enqueue(store, "pause-then-event")
    outcome = _cycle(store)
    assert isinstance(outcome, Suspended) and outcome.reason == "paused at a step boundary"
    assert RAN == ["first"]  # second did not start: the event's commit answered with the pause
    assert store.get_event("t1", "stage") == "first done"
    store.resume("t1", actor="alice", reason="go on")
    assert _cycle(store) == Completed("t1", {"mode": "pause-then-event", "signal": None})
    assert RAN == ["first", "second"]


def _commit_plain(store: WorkflowStore, claimed: ClaimedTask) -> Committed:
    return store.commit_checkpoint(claimed.lease, claimed.revision, "{}")


def _commit_event(store: WorkflowStore, claimed: ClaimedTask) -> Committed:
    return store.commit_event(claimed.lease, claimed.revision, "{}", "stage", '"one"')


def _consume_signal(store: WorkflowStore, claimed: ClaimedTask) -> Committed:
    return store.consume_signal(claimed.lease, claimed.revision, "{}", "s1", accepted=True, note="taken")


def _commit_in_step_transaction(store: WorkflowStore, claimed: ClaimedTask) -> Committed:
    with store.step_transaction() as tx:
        return tx.commit_checkpoint(claimed.lease, claimed.revision, "{}")


@pytest.mark.parametrize(
    "commit", [_commit_plain, _commit_event, _consume_signal, _commit_in_step_transaction]
)
def test_every_fenced_commit_answers_with_a_pause_that_reached_the_task(
    store: WorkflowStore, commit: Callable[[WorkflowStore, ClaimedTask], Committed]
) -> None:
    _enqueue(store, "plain")
    store.send_signal("t1", "go", {"n": 1}, signal_id="s1", sender="bob")
    (claimed,) = store.claim(WorkerId.parse("w1"), LEASE)
    store.pause("t1", actor="alice", reason="hold")

    assert commit(store, claimed) == Committed(claimed.revision + 1, None, "paused by alice: hold")


def test_pause_and_resume_refuse_what_they_cannot_do(store: WorkflowStore) -> None:
    with pytest.raises(TaskNotFound):
        store.pause("nope", actor="alice", reason="x")
    _enqueue(store, "plain")
    store.pause("t1", actor="alice", reason="x")
    with pytest.raises(InvalidState, match="already paused"):
        store.pause("t1", actor="alice", reason="again")
    store.resume("t1", actor="alice", reason="x")
    with pytest.raises(InvalidState, match="is not paused"):
        store.resume("t1", actor="alice", reason="again")
    with pytest.raises(InvalidArgument):
        store.pause("t1", actor="", reason="x")
    _cycle(store)
    with pytest.raises(InvalidState, match="only an unfinished task can be paused"):
        store.pause("t1", actor="alice", reason="too late")


def test_cancelling_a_paused_task_cancels_it(store: WorkflowStore) -> None:
    _enqueue(store, "plain")
    store.pause("t1", actor="alice", reason="x")
    assert store.cancel("t1", "alice", "not wanted") is TaskState.CANCELLED
