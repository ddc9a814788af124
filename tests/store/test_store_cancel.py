"""Cancellation in the store contract, on SQLite and PostgreSQL: every checkpoint commit
answers with a pending cancel, a cancel wins over a completion (or suspension, or retry)
that has not committed, and a queued or waiting task with compensations still to run
is handed to a worker instead of being cancelled at once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import CancelPending, LeaseLostError
from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskState
from runifold_sync.store.records import ClaimedTask, ClaimRequest, Committed
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
NOTE = "cancelled by ops: customer left"
# What the store reads of a checkpoint: the calls with a compensation ("undo") and
# those already compensated.
ONE_TO_UNDO = to_json({"undo": ["reserve#1"], "compensated": []})
ALL_UNDONE = to_json({"undo": ["reserve#1"], "compensated": ["reserve#1"]})


def _enqueue(store: WorkflowStore, task_id: str = "t1") -> None:
    store.enqueue(WorkflowTask.new("orders", 1, {"order_id": task_id}, checkpoint_id=task_id))


def _claim(store: WorkflowStore) -> ClaimedTask:
    (claimed,) = store.claim(W1, LEASE)
    return claimed


def test_cancel_takes_actor_and_reason_positionally_and_a_commit_answers_with_the_request(
    store: WorkflowStore,
) -> None:
    _enqueue(store)
    claimed = _claim(store)
    assert store.commit_checkpoint(claimed.lease, 0, "{}") == Committed(1, None, None)

    assert store.cancel("t1", "ops", "customer left") is TaskState.LEASED

    assert store.commit_checkpoint(claimed.lease, 1, "{}") == Committed(2, NOTE, None)
    event = store.history("t1")[-1]
    assert (event.kind, event.detail) == ("cancel_requested", {"actor": "ops", "reason": "customer left"})


def test_consuming_a_signal_answers_with_a_pending_cancel(store: WorkflowStore) -> None:
    _enqueue(store)
    store.send_signal("t1", "approval", "true", signal_id="s1", sender="alice")
    claimed = _claim(store)
    store.cancel("t1", "ops", "customer left")

    committed = store.consume_signal(claimed.lease, 0, "{}", "s1", accepted=True, note="taken")

    assert committed == Committed(1, NOTE, None)


TRANSITIONS: dict[str, Callable[[WorkflowStore, ClaimedTask], Any]] = {
    "complete": lambda s, c: s.complete(c.lease, c.revision, "{}", "null"),
    "suspend": lambda s, c: s.suspend(c.lease, c.revision, "{}", wake_at=None, reason="wait", signal="go"),
    "retry": lambda s, c: s.retry(c.lease, c.revision, "{}", delay=timedelta(hours=1), reason="again"),
}


@pytest.mark.parametrize("transition", sorted(TRANSITIONS))
def test_a_pending_cancel_refuses_the_end_of_a_run_and_the_worker_acknowledges_it(
    store: WorkflowStore, transition: str
) -> None:
    _enqueue(store)
    claimed = _claim(store)
    store.cancel("t1", "ops", "customer left")

    with pytest.raises(CancelPending, match="pending cancel") as refused:
        TRANSITIONS[transition](store, claimed)

    assert (refused.value.task_id, refused.value.request) == ("t1", NOTE)
    record = store.get_task("t1")
    assert (record.state, record.revision) == (TaskState.LEASED, 0)  # nothing was written
    store.acknowledge_cancel(claimed.lease, claimed.revision, '{"stopped":true}')
    record = store.get_task("t1")
    assert (record.state, record.reason, record.checkpoint_json) == (
        TaskState.CANCELLED,
        NOTE,
        '{"stopped":true}',
    )


def test_a_completion_with_then_claim_refused_by_a_cancel_claims_nothing(store: WorkflowStore) -> None:
    _enqueue(store, "t1")
    claimed = _claim(store)
    _enqueue(store, "t2")
    store.cancel("t1", "ops", "customer left")

    with pytest.raises(CancelPending):
        store.complete(claimed.lease, 0, "{}", "null", then_claim=ClaimRequest(W1, LEASE))

    assert store.get_task("t2").state is TaskState.QUEUED


def test_a_lost_lease_is_reported_as_lost_even_with_a_cancel_pending(store: WorkflowStore) -> None:
    _enqueue(store)
    old = _claim(store)
    store.cancel("t1", "ops", "customer left")
    store.set_clock_offset(timedelta(seconds=31))
    _claim(store)  # another worker takes over

    with pytest.raises(LeaseLostError):
        store.complete(old.lease, old.revision, "{}", "null")


@pytest.mark.parametrize("parked", ["queued", "waiting"])
def test_cancelling_an_unleased_task_with_compensations_to_run_queues_it_for_a_worker(
    store: WorkflowStore, parked: str
) -> None:
    _enqueue(store)
    claimed = _claim(store)
    if parked == "waiting":
        store.suspend(
            claimed.lease, 0, ONE_TO_UNDO, wake_at=None, reason="waiting for signal 'go'", signal="go"
        )
    else:
        store.retry(claimed.lease, 0, ONE_TO_UNDO, delay=timedelta(hours=1), reason="step failed")

    assert store.cancel("t1", "ops", "customer left") is TaskState.QUEUED

    record = store.get_task("t1")
    assert (record.state, record.reason) == (TaskState.QUEUED, f"{NOTE}; its compensations run next")
    event = store.history("t1")[-1]
    assert (event.kind, event.detail) == ("cancel_requested", {"actor": "ops", "reason": "customer left"})
    undoing = _claim(store)  # due now, whatever the wait or backoff said
    assert undoing.lease.cancel_requested == NOTE
    store.acknowledge_cancel(undoing.lease, undoing.revision, ALL_UNDONE)
    assert (store.get_task("t1").state, store.get_task("t1").reason) == (TaskState.CANCELLED, NOTE)


@pytest.mark.parametrize("checkpoint", [None, ALL_UNDONE, to_json({"journal": []})])
def test_cancelling_a_waiting_task_with_nothing_left_to_undo_ends_it_at_once(
    store: WorkflowStore, checkpoint: str | None
) -> None:
    _enqueue(store)
    if checkpoint is not None:
        claimed = _claim(store)
        store.suspend(claimed.lease, 0, checkpoint, wake_at=None, reason="waiting", signal="go")

    assert store.cancel("t1", "ops", "customer left") is TaskState.CANCELLED

    assert store.get_task("t1").state is TaskState.CANCELLED
    assert store.claim(W1, LEASE) == []
