"""A worker that claims ahead (several tasks at once, or the next task with a completion)
runs them in turn, keeps the waiting ones' leases alive, reports a lease lost while
waiting, hands waiting ones back when the task before them runs long, and hands unstarted
ones back on close."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from runifold_sync import (
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
from runifold_sync.errors import InvalidArgument
from runifold_sync.outcomes import Completed, Idle, LeaseLost
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState

LEASE = LeaseDuration(timedelta(seconds=1))
flow = Workflow("batched", 1)


# Set by a test to make the task of value 0 wait in its step until it is released.
SLOW_STEP: dict[str, threading.Event] = {}


@flow.step()
def double(ctx: StepContext, value: int) -> int:
    if value == 0 and SLOW_STEP:
        SLOW_STEP["started"].set()
        SLOW_STEP["release"].wait(10)
    return value * 2


@flow.main
def main(ctx: WorkflowContext, value: int) -> int:
    return double(ctx, value)


def _worker(store: SqliteWorkflowStore, batch: int, heartbeat_s: float = 0.05) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))
    return WorkflowWorker(
        store, registry, WorkerId.parse("batcher"), LEASE, timedelta(seconds=heartbeat_s), claim_batch=batch
    )


def _enqueue(store: SqliteWorkflowStore, count: int) -> list[str]:
    ids = [f"b{n}" for n in range(count)]
    store.enqueue_many([WorkflowTask.new("batched", 1, n, checkpoint_id=i) for n, i in enumerate(ids)])
    return ids


def test_a_batch_is_claimed_once_and_run_in_turn_with_waiting_leases_kept_alive(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    ids = _enqueue(sqlite_store, 3)
    worker = _worker(sqlite_store, batch=3)
    try:
        assert worker.run_once() == Completed("b0", 0)
        assert {sqlite_store.get_task(i).state for i in ids[1:]} == {TaskState.LEASED}
        time.sleep(1.5)  # longer than the lease: only the heartbeat thread keeps b1, b2
        assert worker.run_once() == Completed("b1", 2)
        assert worker.run_once() == Completed("b2", 4)
    finally:
        worker.close()
    claims = [e for i in ids for e in sqlite_store.history(i) if e.kind == "claimed"]
    assert [e.fencing_token for e in claims] == [1, 1, 1]  # one claim each, never re-claimed


def test_a_lease_lost_while_waiting_is_reported_and_the_task_left_to_its_new_owner(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    _enqueue(sqlite_store, 2)
    worker = _worker(sqlite_store, batch=2)
    try:
        assert worker.run_once() == Completed("b0", 0)
        sqlite_store.set_clock_offset(timedelta(seconds=5))  # b1's lease expired in store time
        (taken,) = sqlite_store.claim(WorkerId.parse("other"), LEASE)
        time.sleep(0.2)  # the heartbeat thread finds b1's lease gone
        assert worker.run_once() == LeaseLost("b1", 1)
    finally:
        worker.close()
    record = sqlite_store.get_task("b1")
    assert (record.state, record.worker_id, record.fencing_token) == (TaskState.LEASED, "other", 2)
    assert taken.lease.fencing_token == 2


def test_tasks_waiting_behind_a_long_task_go_back_to_the_queue_for_other_workers(
    sqlite_store: SqliteWorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = _enqueue(sqlite_store, 3)
    monkeypatch.setitem(SLOW_STEP, "started", threading.Event())
    monkeypatch.setitem(SLOW_STEP, "release", threading.Event())
    worker = _worker(sqlite_store, batch=3)
    outcomes = []
    running = threading.Thread(target=lambda: outcomes.append(worker.run_once()))
    running.start()
    try:
        assert SLOW_STEP["started"].wait(5)
        deadline = time.monotonic() + 5  # half the 1 s lease, then the next beat
        while sqlite_store.get_task("b2").state is not TaskState.QUEUED and time.monotonic() < deadline:
            time.sleep(0.02)
        assert [sqlite_store.get_task(i).state for i in ids] == [
            TaskState.LEASED,
            TaskState.QUEUED,
            TaskState.QUEUED,
        ]
        released = sqlite_store.history("b1")[-1]
        assert released.kind == "released"
        assert str(released.detail["reason"]).startswith("handed back unstarted: the task before it ran")
        other = [c.lease.task_id for c in sqlite_store.claim(WorkerId.parse("idle"), LEASE, limit=10)]
        assert other == ids[1:]
    finally:
        SLOW_STEP["release"].set()
        running.join(10)
    try:
        assert outcomes == [Completed("b0", 0)]
        assert worker.run_once() == Idle()  # the handed-back tasks are skipped, not lost
    finally:
        worker.close()
    for task_id in ids[1:]:
        record = sqlite_store.get_task(task_id)
        assert (record.worker_id, record.claims_since_progress) == ("idle", 1)


def test_closing_hands_unstarted_tasks_back_without_counting_an_attempt(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    ids = _enqueue(sqlite_store, 4)
    worker = _worker(sqlite_store, batch=4)
    assert worker.run_once() == Completed("b0", 0)
    worker.close()
    for task_id in ids[1:]:
        record = sqlite_store.get_task(task_id)
        assert (record.state, record.claims_since_progress) == (TaskState.QUEUED, 0)
        assert sqlite_store.history(task_id)[-1].kind == "released"
    assert [c.lease.task_id for c in sqlite_store.claim(WorkerId.parse("next"), LEASE, limit=10)] == ids[1:]


def test_claim_next_leases_the_next_task_in_the_completions_transaction(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    ids = _enqueue(sqlite_store, 3)
    worker = _worker(sqlite_store, batch=1)
    try:
        assert worker.run_once(claim_next=True) == Completed("b0", 0)
        completed = sqlite_store.history("b0")[-1]
        claimed = sqlite_store.history("b1")[-1]
        assert (completed.kind, claimed.kind, claimed.worker_id) == ("completed", "claimed", "batcher")
        assert claimed.at == completed.at  # one transaction: one store time
        assert sqlite_store.get_task("b2").state is TaskState.QUEUED  # one ahead, as the batch says
        assert worker.run_once() == Completed("b1", 2)
        assert sqlite_store.get_task("b2").state is TaskState.QUEUED  # without claim_next, none
        assert worker.run_once(claim_next=True) == Completed("b2", 4)
        assert worker.run_once(claim_next=True) == Idle()
    finally:
        worker.close()
    claims = [e for i in ids for e in sqlite_store.history(i) if e.kind == "claimed"]
    assert [e.fencing_token for e in claims] == [1, 1, 1]


def test_a_task_claimed_with_a_completion_is_handed_back_on_close(sqlite_store: SqliteWorkflowStore) -> None:
    _enqueue(sqlite_store, 2)
    worker = _worker(sqlite_store, batch=1)
    assert worker.run_once(claim_next=True) == Completed("b0", 0)
    worker.close()
    record = sqlite_store.get_task("b1")
    assert (record.state, record.claims_since_progress) == (TaskState.QUEUED, 0)
    assert [e.kind for e in sqlite_store.history("b1")] == ["enqueued", "claimed", "released"]


@pytest.mark.parametrize("batch", [0, 101, True, 2.0, "AUTO", "10"])
def test_a_claim_batch_other_than_auto_or_1_to_100_is_refused(
    sqlite_store: SqliteWorkflowStore, batch: object
) -> None:
    with pytest.raises(InvalidArgument, match="claim_batch must be 'auto' or an integer in 1..100"):
        _worker(sqlite_store, batch=batch)  # type: ignore[arg-type]
