"""``complete_batch`` on each store: several tasks' completions in one transaction, each
written as ``complete`` writes it (result, head, journal rows, history event, a waiting
parent woken), the refused ones reported rather than raised, then the claim."""

from __future__ import annotations

from datetime import timedelta

import attrs
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import CancelPending, InvalidArgument, LeaseLostError
from runifold_sync.model.checkpoint import JournalRow
from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.records import ClaimedTask, ClaimRequest, Completion
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
HEAD = to_json({"phase": "completed"})


def _enqueue(store: WorkflowStore, *task_ids: str, parent: str | None = None) -> None:
    for task_id in task_ids:
        task = WorkflowTask.new("orders", 1, {"order_id": task_id}, checkpoint_id=task_id)
        assert store.enqueue(attrs.evolve(task, parent_id=parent)).created


def _claim(store: WorkflowStore, count: int) -> list[ClaimedTask]:
    claimed = store.claim(W1, LEASE, limit=count)
    assert len(claimed) == count, claimed
    return claimed


def _completion(claimed: ClaimedTask, result: object) -> Completion:
    row = JournalRow("", 0, to_json({"result": result}))
    return Completion(claimed.lease, claimed.revision, HEAD, to_json(result), (row,))


def test_each_completion_of_a_batch_is_written_as_complete_writes_it(store: WorkflowStore) -> None:
    _enqueue(store, "t1", "t2", "t3")
    claimed = _claim(store, 3)
    done = store.complete_batch([_completion(c, n) for n, c in enumerate(claimed)])
    assert done.refused == {} and done.claimed == []
    for n, c in enumerate(claimed):
        task_id = c.lease.task_id
        record = store.get_task(task_id)
        assert (record.state, record.outcome, record.result_json) == (
            TaskState.TERMINAL,
            TaskOutcome.COMPLETED,
            to_json(n),
        )
        assert (record.checkpoint_json, record.revision, record.lease_expires) == (HEAD, 1, None)
        assert store.read_journal(task_id) == [JournalRow("", 0, to_json({"result": n}))]
        event = store.history(task_id)[-1]
        assert (event.kind, event.worker_id, event.fencing_token) == ("completed", "worker-1", 1)


def test_a_refused_completion_is_reported_and_the_others_still_commit(store: WorkflowStore) -> None:
    _enqueue(store, "t1", "t2", "t3", "t4")
    first, cancelled, lost = _claim(store, 3)
    assert store.cancel(cancelled.lease.task_id, "ops", "not wanted") is TaskState.LEASED
    stale = attrs.evolve(lost.lease, fencing_token=lost.lease.fencing_token - 1)
    done = store.complete_batch(
        [_completion(first, 1), _completion(cancelled, 2), Completion(stale, 0, HEAD, "3")],
        then_claim=ClaimRequest(W1, LEASE),
    )
    assert set(done.refused) == {"t2", "t3"}
    assert isinstance(done.refused["t2"], CancelPending)
    assert isinstance(done.refused["t3"], LeaseLostError)
    assert store.get_task("t1").outcome is TaskOutcome.COMPLETED
    for task_id in ("t2", "t3"):  # refused rows are untouched: still leased, nothing journaled
        record = store.get_task(task_id)
        assert (record.state, record.result_json, record.revision) == (TaskState.LEASED, None, 0)
        assert store.read_journal(task_id) == []
        assert "completed" not in [e.kind for e in store.history(task_id)]
    assert [c.lease.task_id for c in done.claimed] == ["t4"]  # the claim went ahead


def test_a_batch_whose_every_completion_is_refused_claims_nothing(store: WorkflowStore) -> None:
    _enqueue(store, "t1", "t2")
    (claimed,) = _claim(store, 1)
    store.set_clock_offset(timedelta(seconds=31))  # the lease ran out
    done = store.complete_batch([_completion(claimed, 1)], then_claim=ClaimRequest(W1, LEASE))
    assert list(done.refused) == ["t1"] and isinstance(done.refused["t1"], LeaseLostError)
    assert done.claimed == []
    assert store.get_task("t2").state is TaskState.QUEUED
    assert [e.kind for e in store.history("t2")] == ["enqueued"]


def test_a_child_completed_in_a_batch_wakes_its_waiting_parent(store: WorkflowStore) -> None:
    _enqueue(store, "p")
    _enqueue(store, "c1", "c2", parent="p")
    (parent,) = _claim(store, 1)
    store.suspend(parent.lease, parent.revision, "{}", wake_at=None, reason="w", child="c2")
    children = _claim(store, 2)
    assert [c.lease.task_id for c in children] == ["c1", "c2"]
    store.complete_batch([_completion(c, 1) for c in children])
    woken = store.get_task("p")
    assert woken.state is TaskState.WAITING and woken.ready_at is not None
    assert woken.ready_at <= store.now()


def test_an_empty_batch_or_a_task_named_twice_is_refused_before_anything_is_written(
    store: WorkflowStore,
) -> None:
    _enqueue(store, "t1")
    (claimed,) = _claim(store, 1)
    with pytest.raises(InvalidArgument, match="none"):
        store.complete_batch([])
    with pytest.raises(InvalidArgument, match="'t1'"):
        store.complete_batch([_completion(claimed, 1), _completion(claimed, 2)])
    assert store.get_task("t1").state is TaskState.LEASED
