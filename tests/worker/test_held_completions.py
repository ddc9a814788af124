"""Completions held for a claim batch's one commit (``batch.py``), in
``WorkflowWorker.run`` on both stores: the batch's ends commit together with the next
claim, each task is reported complete only once its end is stored, a cancel requested
while a completion is held wins, a lease lost while held is reported lost, a stop
commits what is held, and a long body holds no completion past a heartbeat."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    StepContext,
    WorkerId,
    WorkerReport,
    WorkerSettings,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.outcomes import RunOutcome
from runifold_sync.store import TaskState
from runifold_sync.store.records import ClaimedTask
from runifold_sync.worker.observer import CycleObserver
from tests.support.backends import Backend

LEASE = LeaseDuration(timedelta(seconds=5))
HEARTBEAT = timedelta(seconds=1)
QUICK = {"min_backoff": timedelta(milliseconds=10), "max_backoff": timedelta(milliseconds=50)}
flow = Workflow("held", 1)

# What the step of task "h<n>" does besides returning n + 1, keyed by n (set per test).
ACTIONS: dict[int, Any] = {}
SEEN: dict[int, list[TaskState]] = {}  # by n: the states of the earlier tasks as its step began


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    ACTIONS.clear()
    SEEN.clear()
    yield
    ACTIONS.clear()
    SEEN.clear()


@flow.step()
def only(ctx: StepContext, n: int) -> int:
    action = ACTIONS.get(n)
    if action is not None:
        action()
    return n + 1


@flow.main
def main(ctx: WorkflowContext, n: int) -> int:
    return only(ctx, n)


def _enqueue(store: WorkflowStore, count: int) -> list[str]:
    ids = [f"h{n}" for n in range(count)]
    store.enqueue_many(
        [WorkflowTask.new("held", 1, n, checkpoint_id=i, priority=count - n) for n, i in enumerate(ids)]
    )
    return ids


def _run(
    store: WorkflowStore, token: CancellationToken, observer: CycleObserver | None = None, **loop: Any
) -> WorkerReport:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))
    settings = WorkerSettings(LEASE, HEARTBEAT, claim_batch=3)
    worker = WorkflowWorker(store, registry, WorkerId.parse("batcher"), settings=settings, observer=observer)
    try:
        return worker.run(token, **loop, **QUICK)
    finally:
        worker.close()


def _count(store: WorkflowStore, monkeypatch: pytest.MonkeyPatch, *names: str) -> dict[str, int]:
    """Calls of the store's operations ``names`` the worker makes, counted as they pass."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(store, name)

        def counted(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    return calls


def _stop_when_done(store: WorkflowStore, ids: list[str], token: CancellationToken) -> Any:
    """An ``on_outcome`` that stops the loop once every task has ended, and checks that
    each task reported complete is already stored complete (durable before reported)."""
    heard: list[RunOutcome] = []

    def on_outcome(outcome: RunOutcome) -> None:
        heard.append(outcome)
        task_id = getattr(outcome, "task_id", None)
        if outcome.kind == "completed":
            assert store.get_task(task_id).state is TaskState.TERMINAL, task_id
        if all(store.get_task(i).state in (TaskState.TERMINAL, TaskState.CANCELLED) for i in ids):
            token.cancel()

    return heard, on_outcome


def test_a_batch_of_one_step_tasks_commits_its_ends_once_with_the_next_claim(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = backend.open()
    ids = _enqueue(store, 6)
    calls = _count(store, monkeypatch, "claim", "complete", "complete_batch")
    token = CancellationToken()
    heard, on_outcome = _stop_when_done(store, ids, token)
    report = _run(store, token, on_outcome=on_outcome)
    assert report.outcomes == {"completed": 6} and report.tasks == 6
    assert [getattr(o, "task_id", None) for o in heard] == ids  # in the order they ran
    assert [store.get_task(i).result for i in ids] == [n + 1 for n in range(6)]
    # Two batches of three: one claim by the worker, the second batch claimed by the
    # first batch's commit, and no completion of its own for any task.
    assert calls == {"claim": 1, "complete": 0, "complete_batch": 2}
    # Each step's result went with its end (inline in the head, a journal's newest entries).
    assert all("only#1" in (store.get_task(i).checkpoint_json or "") for i in ids)


def test_a_cancel_requested_while_a_completion_is_held_wins(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, 3)
    ACTIONS[1] = lambda: store.cancel("h0", actor="ops", reason="not wanted")  # h0 is held now
    token = CancellationToken()
    heard, on_outcome = _stop_when_done(store, ids, token)
    report = _run(store, token, on_outcome=on_outcome)
    assert report.outcomes == {"cancelled": 1, "completed": 2}
    assert [o.kind for o in heard] == ["cancelled", "completed", "completed"]
    record = store.get_task("h0")
    assert (record.state, record.result_json) == (TaskState.CANCELLED, None)
    assert [store.get_task(i).result for i in ids[1:]] == [2, 3]


def test_a_held_completion_whose_lease_ran_out_is_reported_lost_and_runs_again(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, 3)
    # While h1 runs, store time passes every lease held (h0's completion is held).
    ACTIONS[1] = lambda: store.set_clock_offset(LEASE.value * 3)
    token = CancellationToken()
    heard, on_outcome = _stop_when_done(store, ids, token)
    _run(store, token, on_outcome=on_outcome)
    first = [o for o in heard if getattr(o, "task_id", None) == "h0"]
    assert [o.kind for o in first] == ["lease_lost", "completed"]  # lost while held, then run again
    assert [store.get_task(i).result for i in ids] == [1, 2, 3]


def test_a_stop_between_cycles_commits_what_is_held_and_hands_back_the_rest(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, 4)
    token = CancellationToken()
    ACTIONS[1] = token.cancel  # h0's completion is held; h2 waits its turn
    heard: list[RunOutcome] = []
    report = _run(store, token, on_outcome=heard.append)
    assert report == WorkerReport({"completed": 2}, tasks=2, reached_max_tasks=False)
    assert [store.get_task(i).result for i in ids[:2]] == [1, 2]
    assert [e.kind for e in store.history("h2")] == ["enqueued", "claimed", "released"]
    assert [e.kind for e in store.history("h3")] == ["enqueued"]  # the stop claimed nothing


def test_a_long_body_holds_no_completion_past_the_next_heartbeat(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, 3)

    def look(key: int, n: int) -> None:
        SEEN[key] = [store.get_task(i).state for i in ids[:n]]

    def long_body() -> None:
        look(1, 1)
        time.sleep(HEARTBEAT.total_seconds() * 2.5)  # past two beats of the heartbeat thread
        look(10, 1)

    ACTIONS[1] = long_body
    ACTIONS[2] = lambda: look(2, 2)
    token = CancellationToken()
    heard, on_outcome = _stop_when_done(store, ids, token)
    _run(store, token, on_outcome=on_outcome)
    assert SEEN[1] == [TaskState.LEASED]  # h0's completion held as h1 began
    assert SEEN[10] == [TaskState.TERMINAL]  # committed by the heartbeat thread during h1's body
    # h1 ran past the hold limit: its end was committed before h2's body began.
    assert SEEN[2] == [TaskState.TERMINAL, TaskState.TERMINAL]
    assert [o.kind for o in heard] == ["completed"] * 3


class _Finishes(CycleObserver):
    """Hears each finished task with the state its row had at that moment."""

    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self.finished_as: list[tuple[str, str, TaskState]] = []

    def finished(self, claimed: ClaimedTask, outcome: RunOutcome, duration_s: float) -> None:
        task_id = claimed.lease.task_id
        self.finished_as.append((task_id, outcome.kind, self.store.get_task(task_id).state))


def test_the_observer_hears_a_held_task_finish_once_its_end_is_stored(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, 3)
    token = CancellationToken()
    _heard, on_outcome = _stop_when_done(store, ids, token)
    observer = _Finishes(store)
    _run(store, token, observer, on_outcome=on_outcome)
    assert observer.finished_as == [(i, "completed", TaskState.TERMINAL) for i in ids]
