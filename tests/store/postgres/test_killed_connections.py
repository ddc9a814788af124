"""A server connection killed under a worker (``pg_terminate_backend``, as a pooler, an
operator or a failover does) costs the worker a reconnection, not a lease.

- A worker whose store connections are terminated every tenth of a second runs its
  tasks to the end under its leases: a commit or heartbeat on a dropped connection is
  sent again at once on a fresh one, a claim whose answer was lost is handed back, so no
  cycle fails and no task waits out its 30 s lease to be taken over.
- An idle worker whose LISTEN connection is terminated takes new work within a moment,
  where a failed wait used to sleep the whole maximum backoff (5 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    StepContext,
    WorkerId,
    WorkerReport,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import StoreUnavailable
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store import TaskOutcome, TaskState

LEASE = LeaseDuration(timedelta(seconds=30))
HEARTBEAT = timedelta(seconds=0.5)
STEPS = 8
TASKS = 4

flow = Workflow("killed", 1)


@flow.step()
def work(ctx: StepContext, n: int) -> int:
    time.sleep(0.05)
    return n + 1


@flow.main
def main(ctx: WorkflowContext, n: int) -> int:
    for _ in range(STEPS):
        n = work(ctx, n)
    return n


def _worker(store: PostgresWorkflowStore) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))
    return WorkflowWorker(store, registry, WorkerId.parse("killed-1"), LEASE, HEARTBEAT)


def _terminate_store_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


@contextmanager
def _running(worker: WorkflowWorker) -> Iterator[Callable[[], WorkerReport]]:
    token = CancellationToken()
    report: list[WorkerReport] = []
    # The default backoff: at most 5 s between failed cycles or waits.
    thread = threading.Thread(target=lambda: report.append(worker.run(token)), daemon=True)
    thread.start()

    def stop() -> WorkerReport:
        token.cancel()
        thread.join(30)
        assert not thread.is_alive(), "the worker loop did not stop"
        return report[0]

    try:
        yield stop
    finally:
        token.cancel()
        thread.join(30)
        worker.close()


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``condition()``; the test's own reads may meet a killed connection."""
    began = time.monotonic()
    while True:
        try:
            if condition():
                return time.monotonic() - began
        except StoreUnavailable:
            pass
        assert time.monotonic() - began < timeout_s, what
        time.sleep(0.02)


@pytest.mark.timeout(120)
def test_tasks_finish_within_their_leases_while_their_connections_are_killed(postgres_url: str) -> None:
    store = PostgresWorkflowStore.connect(postgres_url, max_size=4)
    ids = [f"t{n}" for n in range(TASKS)]
    store.enqueue_many([WorkflowTask.new("killed", 1, n * 100, checkpoint_id=t) for n, t in enumerate(ids)])
    stop_killing = threading.Event()
    kills: list[int] = []

    def killer() -> None:
        while not stop_killing.wait(0.1):
            kills.append(_terminate_store_backends(postgres_url))

    thread = threading.Thread(target=killer, daemon=True)
    try:
        with _running(_worker(store)) as stop:
            thread.start()
            # Well inside the 30 s lease: a task whose cycle failed would wait it out.
            _wait(
                lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in ids),
                20,
                "the tasks did not finish within 20 s while their connections were killed",
            )
            stop_killing.set()
            thread.join(10)
            report = stop()
    finally:
        stop_killing.set()
    assert sum(kills) >= 20, kills  # the worker's connections were killed again and again
    for n, task_id in enumerate(ids):
        record = store.get_task(task_id)
        assert (record.outcome, record.result) == (TaskOutcome.COMPLETED, n * 100 + STEPS), record.reason
        # Never taken over from an expired lease: each lease held until its task ended,
        # or was handed back at once (a claim whose answer was lost with its connection).
        claims = [e for e in store.history(task_id) if e.kind == "claimed"]
        assert [e.detail for e in claims if e.detail.get("from_state") == "leased"] == [], claims
    assert report.outcomes.get("lease_lost") is None, report.outcomes
    store.close()


@pytest.mark.timeout(60)
def test_an_idle_worker_whose_listen_connection_is_killed_takes_new_work_at_once(postgres_url: str) -> None:
    store = PostgresWorkflowStore.connect(postgres_url, max_size=4)
    with _running(_worker(store)) as stop:
        store.enqueue(WorkflowTask.new("killed", 1, 0, checkpoint_id="warm-up"))
        _wait(lambda: store.get_task("warm-up").state is TaskState.TERMINAL, 30, "the worker never ran")
        time.sleep(0.5)  # idle, LISTENing in wait_for_work
        assert _terminate_store_backends(postgres_url) >= 1
        time.sleep(0.2)
        store.enqueue(WorkflowTask.new("killed", 1, 0, checkpoint_id="after"))
        picked_up_s = _wait(
            lambda: store.get_task("after").state is not TaskState.QUEUED,
            10,
            "the new task was never claimed",
        )
        stop()
    assert picked_up_s < 2.0, picked_up_s
    store.close()
