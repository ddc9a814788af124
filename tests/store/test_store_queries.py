"""Operator reads and actions of the store contract, on SQLite and PostgreSQL: listing,
referenced versions (the deploy preflight), queue statistics and requeue."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument, InvalidState, TaskNotFound
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.records import VersionReference
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")


def _enqueue(
    store: WorkflowStore, task_id: str, name: str = "orders", version: int = 1, tenant: str = "acme"
) -> None:
    store.enqueue(WorkflowTask.new(name, version, {"id": task_id}, checkpoint_id=task_id, tenant=tenant))


def _fail(store: WorkflowStore, task_id: str, ambiguous_effect: str | None = None) -> None:
    """Claim the oldest ready task, which must be ``task_id``, and fail it."""
    (claimed,) = store.claim(W1, LEASE)
    assert claimed.lease.task_id == task_id
    store.fail(claimed.lease, claimed.revision, None, reason="boom", ambiguous_effect=ambiguous_effect)


def test_task_records_reads_many_tasks_in_the_order_asked_as_stored(store: WorkflowStore) -> None:
    for task_id in ("a1", "a2", "a3"):
        _enqueue(store, task_id)
    store.claim(W1, LEASE)  # leases a1
    records = store.task_records(["a3", "a1", "a3"])
    assert [r.task_id for r in records] == ["a3", "a1", "a3"]
    assert [r.state for r in records] == [TaskState.QUEUED, TaskState.LEASED, TaskState.QUEUED]
    # As stored: get_task explains a ready task no live worker serves, task_records does not.
    assert store.get_task("a3").status_note is not None
    assert records[0].status_note is None
    assert store.task_records([]) == []
    with pytest.raises(TaskNotFound):
        store.task_records(["a1", "missing"])


def test_list_tasks_filters_by_state_tenant_and_definition_oldest_first(store: WorkflowStore) -> None:
    _enqueue(store, "a1")
    _enqueue(store, "a2", name="invoices")
    _enqueue(store, "b1", tenant="globex")
    store.claim(W1, LEASE)  # leases a1, the oldest
    assert [t.task_id for t in store.list_tasks()] == ["a1", "a2", "b1"]
    assert [t.task_id for t in store.list_tasks(state=TaskState.QUEUED)] == ["a2", "b1"]
    assert [t.task_id for t in store.list_tasks(tenant="globex")] == ["b1"]
    assert [t.task_id for t in store.list_tasks(definition="invoices")] == ["a2"]
    assert [t.task_id for t in store.list_tasks(state=TaskState.LEASED, tenant="acme")] == ["a1"]
    assert [t.task_id for t in store.list_tasks(limit=2)] == ["a1", "a2"]


def test_list_tasks_refuses_a_bad_limit_or_state(store: WorkflowStore) -> None:
    with pytest.raises(InvalidArgument, match="list limit must be an integer in 1..10000, got 0"):
        store.list_tasks(limit=0)
    with pytest.raises(InvalidArgument, match="state must be a TaskState, got 'queued'"):
        store.list_tasks(state="queued")  # type: ignore[arg-type]


def test_referenced_versions_counts_unfinished_and_recoverable_tasks_only(store: WorkflowStore) -> None:
    _enqueue(store, "q1")
    _enqueue(store, "q2", version=2)
    _enqueue(store, "done", version=3)
    _enqueue(store, "broken", version=3)
    _enqueue(store, "ambiguous", version=4)
    _enqueue(store, "napping")  # waits on a timer, beside q1's lease
    _enqueue(store, "parked", version=5)  # waits for a signal: its version's only reference
    for c in store.claim(W1, LEASE, limit=10):
        if c.lease.task_id == "napping":
            store.suspend(c.lease, c.revision, "{}", wake_at=store.now() + timedelta(hours=1), reason="timer")
        elif c.lease.task_id == "parked":
            store.suspend(c.lease, c.revision, "{}", wake_at=None, reason="approval", signal="approve")
        elif c.lease.task_id == "done":
            store.complete(c.lease, c.revision, "{}", "null")
        elif c.lease.task_id == "broken":
            store.fail(c.lease, c.revision, None, reason="boom")
        elif c.lease.task_id == "ambiguous":
            store.fail(c.lease, c.revision, None, reason="unknown", ambiguous_effect="ambiguous/charge#1")
        elif c.lease.task_id == "q2":
            store.release(c.lease, delay=timedelta(0), reason="back")
    assert store.referenced_versions() == [
        VersionReference("orders", 1, queued=0, leased=1, waiting=1, recoverable=0),
        VersionReference("orders", 2, queued=1, leased=0, waiting=0, recoverable=0),
        VersionReference("orders", 4, queued=0, leased=0, waiting=0, recoverable=1),
        VersionReference("orders", 5, queued=0, leased=0, waiting=1, recoverable=0),
    ]


def test_queue_stats_counts_per_tenant_state_and_outcome_with_queue_delay(store: WorkflowStore) -> None:
    _enqueue(store, "a1")
    _enqueue(store, "a2")
    _enqueue(store, "b1", tenant="globex")
    _fail(store, "a1")
    store.set_clock_offset(timedelta(seconds=90))
    stats = {(s.tenant, s.state, s.outcome): s for s in store.queue_stats()}
    assert set(stats) == {
        ("acme", TaskState.QUEUED, None),
        ("acme", TaskState.TERMINAL, TaskOutcome.FAILED),
        ("globex", TaskState.QUEUED, None),
    }
    queued = stats[("acme", TaskState.QUEUED, None)]
    assert queued.count == 1
    assert queued.oldest_ready_age_s is not None and 90 <= queued.oldest_ready_age_s < 120
    assert stats[("acme", TaskState.TERMINAL, TaskOutcome.FAILED)].oldest_ready_age_s is None


def test_requeue_puts_a_failed_task_back_with_its_checkpoint_and_audits_it(store: WorkflowStore) -> None:
    _enqueue(store, "t1")
    claimed = store.claim(W1, LEASE)[0]
    revision = store.commit_checkpoint(claimed.lease, claimed.revision, '{"kept":true}').revision
    store.fail(claimed.lease, revision, None, reason="boom")
    store.requeue("t1", actor="ops", reason="bug fixed")
    record = store.get_task("t1")
    assert (record.state, record.outcome) == (TaskState.QUEUED, None)
    assert record.reason is None
    assert record.status_note is not None and record.status_note.startswith("ready since")
    assert record.checkpoint_json == '{"kept":true}'
    event = store.history("t1")[-1]
    assert (event.kind, event.detail) == ("requeued", {"actor": "ops", "reason": "bug fixed"})
    assert store.claim(W1, LEASE)[0].checkpoint_json == '{"kept":true}'


def test_requeue_refuses_tasks_that_are_not_plainly_failed(store: WorkflowStore) -> None:
    _enqueue(store, "amb")
    _fail(store, "amb", ambiguous_effect="amb/charge#1")
    _enqueue(store, "queued")
    with pytest.raises(InvalidState, match="'queued' is queued; only a failed task can be requeued"):
        store.requeue("queued", actor="ops", reason="why")
    with pytest.raises(InvalidState, match="resolve its ambiguous effect instead"):
        store.requeue("amb", actor="ops", reason="why")
    with pytest.raises(TaskNotFound):
        store.requeue("missing", actor="ops", reason="why")
    with pytest.raises(InvalidArgument, match="actor must be non-empty"):
        store.requeue("queued", actor="", reason="why")


def test_a_due_task_waits_for_a_free_worker_only_while_a_worker_is_live(store: WorkflowStore) -> None:
    _enqueue(store, "ready")
    ready_since = store.get_task("ready").ready_at
    assert ready_since is not None
    assert store.get_task("ready").status_note == f"ready since {ready_since.isoformat()}: no worker is live"
    store.register_worker(W1, host="h", pid=1, definitions=[("orders", 1)])
    waiting = f"ready since {ready_since.isoformat()}: waiting for a free worker"
    assert store.get_task("ready").status_note == waiting
    assert [r.status_note for r in store.list_tasks()] == [waiting]
    store.worker_stopped(W1, 1)
    assert store.get_task("ready").status_note == f"ready since {ready_since.isoformat()}: no worker is live"


def test_every_unfinished_task_says_why_it_is_not_running(store: WorkflowStore) -> None:
    later = store.now() + timedelta(hours=1)
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="later", not_before=later))
    _enqueue(store, "now")
    (claimed,) = store.claim(W1, LEASE)
    _enqueue(store, "ready")
    assert {r.task_id: r.reason for r in store.list_tasks()} == dict.fromkeys(["later", "now", "ready"])
    reasons = {r.task_id: r.status_note for r in store.list_tasks()}
    assert reasons["later"] == f"scheduled: not claimable before {later.isoformat()}"
    assert reasons["ready"] is not None and reasons["ready"].endswith("no worker is live")
    expires = claimed.lease.expires_at.isoformat()
    assert reasons["now"] == f"running on worker-1 (fencing token 1), lease until {expires}"
    store.set_clock_offset(LEASE.value + timedelta(seconds=1))
    assert store.get_task("now").status_note == (
        f"lease of worker-1 (fencing token 1) expired at {expires}: claimable by another worker"
    )
