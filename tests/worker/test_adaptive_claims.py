"""Workers with the default ``claim_batch="auto"`` on each store: from a deep queue of
short tasks a worker's claims grow past one task; from a queue of long tasks, or a
shallow one, it holds one task at a time; and two workers sharing a shallow queue both
get work, neither holding what the other could run.

What a worker holds is read from the store (``leases_of``, on a store of the test's own)
each time it starts a task, not from the worker."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.store import TaskState, WorkflowStore
from runifold_sync.store.records import ClaimedTask
from runifold_sync.worker.batch import HOLD_BUDGET_S
from runifold_sync.worker.observer import CycleObserver
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=10))
LONG_S = 3 * HOLD_BUDGET_S
BACKOFF = {"min_backoff": timedelta(milliseconds=5), "max_backoff": timedelta(milliseconds=50)}

flow = Workflow("adaptive", 1)


@flow.step()
def nap(ctx: StepContext, seconds: float) -> float:
    if seconds:
        time.sleep(seconds)
    return seconds


@flow.main
def main(ctx: WorkflowContext, seconds: float) -> float:
    return nap(ctx, seconds)


class Holdings(CycleObserver):
    """At each task a worker starts: how many leases it holds, as the store says, and
    which task it is."""

    def __init__(self, store: WorkflowStore, worker_id: WorkerId) -> None:
        self.store = store
        self.worker_id = worker_id
        self.most = 0
        self.started: list[str] = []

    def claimed(self, claimed: ClaimedTask) -> None:
        self.most = max(self.most, len(self.store.leases_of(self.worker_id)))
        self.started.append(claimed.lease.task_id)


def _worker(backend: Backend, name: str) -> tuple[WorkflowWorker, Holdings]:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))
    worker_id = WorkerId.parse(name)
    holdings = Holdings(backend.open(), worker_id)
    return WorkflowWorker(backend.open(), registry, worker_id, LEASE, observer=holdings), holdings


def _enqueue(store: WorkflowStore, prefix: str, count: int, seconds: float) -> list[str]:
    tasks = [WorkflowTask.new("adaptive", 1, seconds, checkpoint_id=f"{prefix}{n}") for n in range(count)]
    store.enqueue_many(tasks)
    return [t.task_id for t in tasks]


def _drain(store: WorkflowStore, ids: list[str], within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(store.get_task(i).state is TaskState.TERMINAL for i in ids):
            return
        time.sleep(0.02)
    raise AssertionError("tasks not done in time")


def test_claims_grow_past_one_task_from_a_deep_queue_of_short_tasks(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, "short", 80, 0)
    worker, holdings = _worker(backend, "deep")
    assert worker.settings.claim_batch == "auto"
    try:
        report = worker.run(CancellationToken(), max_tasks=len(ids), **BACKOFF)
    finally:
        worker.close()
    assert report.tasks == len(ids)
    assert worker.claim_size.largest > 1
    assert holdings.most > 1  # the store saw it hold tasks claimed ahead
    assert {store.get_task(i).state for i in ids} == {TaskState.TERMINAL}


def test_one_task_at_a_time_from_a_deep_queue_of_long_tasks(backend: Backend) -> None:
    store = backend.open()
    ids = _enqueue(store, "long", 5, LONG_S)
    worker, holdings = _worker(backend, "long")
    try:
        report = worker.run(CancellationToken(), max_tasks=len(ids), **BACKOFF)
    finally:
        worker.close()
    assert report.tasks == len(ids)
    assert (worker.claim_size.largest, holdings.most) == (1, 1)


def test_one_task_at_a_time_from_a_shallow_queue_of_short_tasks(backend: Backend) -> None:
    """Tasks arrive one at a time, each taken before the next comes: a claim may ask
    for two after one came back full, but it comes back with one and the size falls
    back, so the worker never holds a second task."""
    store = backend.open()
    worker, holdings = _worker(backend, "shallow")
    shutdown = CancellationToken()
    thread = threading.Thread(target=worker.run, args=(shutdown,), kwargs=BACKOFF, daemon=True)
    thread.start()
    ids: list[str] = []
    try:
        for n in range(12):
            ids += _enqueue(store, f"trickle{n}-", 1, 0)
            _drain(store, ids, within_s=10)
    finally:
        shutdown.cancel()
        thread.join(10)
        worker.close()
    assert holdings.started == ids
    assert holdings.most == 1
    assert worker.claim_size.largest <= 2


def test_two_workers_both_get_work_from_a_shallow_queue_after_a_deep_one(backend: Backend) -> None:
    """A deep queue of short tasks first, so that both workers' claims have grown; then,
    once it is drained, fewer long tasks than twice the workers: each worker takes one
    at a time, so both run them side by side."""
    store = backend.open()
    workers = [_worker(backend, "left"), _worker(backend, "right")]
    shutdown = CancellationToken()
    threads = [
        threading.Thread(target=w.run, args=(shutdown,), kwargs=BACKOFF, daemon=True) for w, _ in workers
    ]
    for thread in threads:
        thread.start()
    try:
        _drain(store, _enqueue(store, "warm", 120, 0))
        time.sleep(0.2)  # both idle: their last claims came back empty
        assert [w.claim_size.limit for w, _ in workers] == [1, 1]
        for _, holdings in workers:
            holdings.started.clear()
            holdings.most = 0
        started = time.monotonic()
        long_ids = _enqueue(store, "slow", 4, LONG_S)
        _drain(store, long_ids)
        took = time.monotonic() - started
    finally:
        shutdown.cancel()
        for thread in threads:
            thread.join(10)
        for w, _ in workers:
            w.close()
    ran = [sorted(holdings.started) for _, holdings in workers]
    assert sorted(ran[0] + ran[1]) == sorted(long_ids)
    assert all(ran), ran  # both workers got work
    assert [holdings.most for _, holdings in workers] == [1, 1]  # neither held a second
    assert took < 4 * LONG_S  # side by side, not in turn
