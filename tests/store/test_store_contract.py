"""The WorkflowStore contract, run against SQLite and PostgreSQL (``contract_backend``).

Store time is moved with ``set_clock_offset`` instead of sleeping; offsets are absolute
from the test's start, and a test's own wall time (well under a second) stays far below
the margins used here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import EnqueueConflict, InvalidArgument, InvalidState, LeaseLostError, TaskNotFound
from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.records import ClaimedTask, ClaimRequest, EffectResolution, Lease
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
W2 = WorkerId.parse("worker-2")
CHECKPOINT = to_json({"phase": "running", "steps": ["reserve#1"]})
LATER = to_json({"phase": "running", "steps": ["reserve#1", "charge#1"]})
SLACK = timedelta(seconds=5)


def enqueue(store: WorkflowStore, task_id: str = "t1", **options: Any) -> WorkflowTask:
    task = WorkflowTask.new("orders", 1, {"order_id": task_id}, checkpoint_id=task_id, **options)
    assert store.enqueue(task).created
    return task


def claim_one(store: WorkflowStore, worker: WorkerId = W1) -> ClaimedTask:
    claimed = store.claim(worker, LEASE)
    assert len(claimed) == 1, claimed
    return claimed[0]


def close_to(actual: datetime | None, expected: datetime, slack: timedelta = SLACK) -> bool:
    assert actual is not None and actual.tzinfo is not None
    return abs(actual - expected) <= slack


def kinds(store: WorkflowStore, task_id: str = "t1") -> list[str]:
    return [event.kind for event in store.history(task_id)]


def taken_over(store: WorkflowStore) -> tuple[Lease, Lease]:
    """Claim t1 as worker-1, let the lease expire, reclaim it as worker-2."""
    old = claim_one(store).lease
    store.set_clock_offset(timedelta(seconds=31))
    new = claim_one(store, W2).lease
    return old, new


# --- enqueue ------------------------------------------------------------------------


def test_enqueue_creates_a_queued_task_with_an_enqueued_event(store: WorkflowStore) -> None:
    task = enqueue(store, priority=3)
    record = store.get_task("t1")
    assert (record.task_id, record.definition_name, record.definition_version) == ("t1", "orders", 1)
    assert (record.tenant, record.priority, record.input_json) == ("default", 3, task.input_json)
    assert record.input == {"order_id": "t1"}
    assert (record.state, record.outcome) == (TaskState.QUEUED, None)
    assert record.reason is None  # nothing recorded; where it stands is derived on reading
    assert record.status_note == f"ready since {record.created_at.isoformat()}: no worker is live"
    assert (record.fencing_token, record.revision, record.claims_since_progress) == (0, 0, 0)
    assert (record.worker_id, record.lease_expires, record.checkpoint_json, record.result_json) == (
        None,
        None,
        None,
        None,
    )
    assert record.created_at.tzinfo is not None and record.created_at.utcoffset() == timedelta(0)
    assert record.ready_at == record.created_at == record.updated_at
    assert close_to(record.created_at, store.now())
    [event] = store.history("t1")
    assert (event.kind, event.worker_id, event.fencing_token) == ("enqueued", None, None)
    assert event.detail == {"definition": "orders", "version": 1}
    assert event.at == record.created_at


def test_enqueue_of_the_same_task_again_returns_it_without_a_second_event(store: WorkflowStore) -> None:
    task = enqueue(store)
    again = store.enqueue(task)
    assert (again.task_id, again.created) == ("t1", False)
    assert kinds(store) == ["enqueued"]


def test_priority_and_not_before_are_not_part_of_a_tasks_identity(store: WorkflowStore) -> None:
    enqueue(store)
    later = datetime.now(UTC) + timedelta(days=1)
    same = WorkflowTask.new("orders", 1, {"order_id": "t1"}, checkpoint_id="t1", priority=9, not_before=later)
    assert not store.enqueue(same).created
    assert store.get_task("t1").priority == 0


@pytest.mark.parametrize(
    ("changes", "label"),
    [
        ({"name": "refunds"}, "definition name"),
        ({"version": 2}, "definition version"),
        ({"tenant": "acme"}, "tenant"),
        ({"input": {"order_id": "other"}}, "input"),
    ],
)
def test_enqueue_with_a_different_field_is_a_conflict_naming_it(
    store: WorkflowStore, changes: dict[str, Any], label: str
) -> None:
    enqueue(store)
    fields: dict[str, Any] = {"name": "orders", "version": 1, "input": {"order_id": "t1"}} | changes
    tenant = fields.pop("tenant", "default")
    other = WorkflowTask.new(
        fields["name"], fields["version"], fields["input"], checkpoint_id="t1", tenant=tenant
    )
    with pytest.raises(EnqueueConflict) as info:
        store.enqueue(other)
    assert (info.value.task_id, info.value.differences) == ("t1", [label])
    assert kinds(store) == ["enqueued"]


def test_an_integer_and_the_equal_float_are_different_inputs(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, {"amount": 1}, checkpoint_id="t1"))
    with pytest.raises(EnqueueConflict):
        store.enqueue(WorkflowTask.new("orders", 1, {"amount": 1.0}, checkpoint_id="t1"))


def test_input_text_comes_back_exactly_as_enqueued(store: WorkflowStore) -> None:
    value = {"zeta": [3, 1e20, -0.0, 2.5], "alpha": "é ☃ \\u0000", "mid": {"b": None, "a": True}}
    task = WorkflowTask.new("orders", 1, value, checkpoint_id="t1")
    store.enqueue(task)
    assert store.get_task("t1").input_json == task.input_json
    assert claim_one(store).input_json == task.input_json
    assert not store.enqueue(task).created


def test_not_before_defers_the_task_by_store_time(store: WorkflowStore) -> None:
    due = store.now() + timedelta(hours=1)
    enqueue(store, not_before=due)
    assert store.get_task("t1").ready_at == due
    assert store.claim(W1, LEASE) == []
    store.set_clock_offset(timedelta(minutes=59))
    assert store.claim(W1, LEASE) == []
    store.set_clock_offset(timedelta(minutes=61))
    assert claim_one(store).lease.task_id == "t1"


def test_not_before_in_the_past_makes_the_task_ready_now(store: WorkflowStore) -> None:
    enqueue(store, not_before=datetime(2000, 1, 1, tzinfo=UTC))
    record = store.get_task("t1")
    assert record.ready_at == record.created_at
    assert claim_one(store).lease.task_id == "t1"


def test_claims_take_higher_priority_first_then_the_earliest_ready(store: WorkflowStore) -> None:
    for task_id, priority in [("low", -1), ("first", 0), ("high", 5), ("second", 0)]:
        enqueue(store, task_id, priority=priority)
    claimed = store.claim(W1, LEASE, limit=10)
    assert [c.lease.task_id for c in claimed] == ["high", "first", "second", "low"]


# --- claim --------------------------------------------------------------------------


def test_a_claim_takes_at_most_limit_tasks(store: WorkflowStore) -> None:
    for n in range(5):
        enqueue(store, f"t{n}")
    assert [len(store.claim(W1, LEASE, limit=2)) for _ in range(4)] == [2, 2, 1, 0]


@pytest.mark.parametrize("limit", [0, -1, 1001, True, 2.0, "3"])
def test_a_claim_limit_outside_1_to_1000_is_refused(store: WorkflowStore, limit: Any) -> None:
    with pytest.raises(InvalidArgument, match="claim limit"):
        store.claim(W1, LEASE, limit=limit)


def test_a_claim_leases_the_task_and_records_who_and_which_token(store: WorkflowStore) -> None:
    task = enqueue(store)
    before = store.now()
    claimed = claim_one(store)
    lease = claimed.lease
    assert (lease.task_id, lease.tenant, lease.worker_id, lease.fencing_token) == (
        "t1",
        "default",
        "worker-1",
        1,
    )
    assert close_to(lease.expires_at, before + LEASE.value)
    assert (claimed.definition_name, claimed.definition_version, claimed.input_json) == (
        "orders",
        1,
        task.input_json,
    )
    assert (
        claimed.revision,
        claimed.checkpoint_json,
        claimed.claims_since_progress,
        claimed.resolutions,
    ) == (
        0,
        None,
        1,
        {},
    )
    record = store.get_task("t1")
    assert (record.state, record.worker_id, record.fencing_token) == (TaskState.LEASED, "worker-1", 1)
    assert record.lease_expires == record.ready_at == lease.expires_at
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token, event.detail) == (
        "claimed",
        "worker-1",
        1,
        {"from_state": "queued"},
    )
    assert event.at == record.updated_at


def test_a_claim_reports_when_the_task_became_due_so_its_queue_delay_is_known(
    store: WorkflowStore,
) -> None:
    enqueue(store)
    due = store.get_task("t1").ready_at
    assert due is not None
    store.set_clock_offset(timedelta(minutes=3))
    claimed = claim_one(store)
    assert (claimed.due_at, claimed.from_state) == (due, "queued")
    assert claimed.claimed_at == store.get_task("t1").updated_at
    assert close_to(due + claimed.queue_delay, due + timedelta(minutes=3))
    store.set_clock_offset(timedelta(minutes=4))
    taken_over = claim_one(store, W2)
    assert (taken_over.from_state, taken_over.due_at) == ("leased", claimed.lease.expires_at)


def test_a_leased_task_is_not_claimable_until_its_lease_expires_in_store_time(store: WorkflowStore) -> None:
    enqueue(store)
    claim_one(store)
    assert store.claim(W2, LEASE) == []
    store.set_clock_offset(timedelta(seconds=25))
    assert store.claim(W2, LEASE) == []
    store.set_clock_offset(timedelta(seconds=31))
    claimed = claim_one(store, W2)
    assert (claimed.lease.worker_id, claimed.lease.fencing_token) == ("worker-2", 2)
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token) == ("claimed", "worker-2", 2)
    assert event.detail == {"from_state": "leased", "expired_owner": "worker-1"}


def test_fencing_tokens_rise_with_every_claim_and_never_fall(store: WorkflowStore) -> None:
    enqueue(store)
    tokens = [claim_one(store).lease.fencing_token]
    store.set_clock_offset(timedelta(seconds=31))
    lease = claim_one(store, W2).lease
    tokens.append(lease.fencing_token)
    store.release(lease, delay=timedelta(0), reason="handing back")
    lease = claim_one(store).lease
    tokens.append(lease.fencing_token)
    store.complete(lease, 0, CHECKPOINT, to_json("done"))
    assert tokens == [1, 2, 3]
    assert store.get_task("t1").fencing_token == 3


def test_claims_since_progress_counts_claims_and_a_checkpoint_resets_it(store: WorkflowStore) -> None:
    enqueue(store)
    assert claim_one(store).claims_since_progress == 1
    store.set_clock_offset(timedelta(seconds=31))
    second = claim_one(store, W2)
    assert second.claims_since_progress == 2
    assert store.get_task("t1").claims_since_progress == 2
    store.commit_checkpoint(second.lease, 0, CHECKPOINT)
    assert store.get_task("t1").claims_since_progress == 0


def test_a_waiting_task_is_claimable_only_when_its_timer_is_due(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    wake_at = store.now() + timedelta(minutes=10)
    store.suspend(lease, 0, CHECKPOINT, wake_at=wake_at, reason="sleeping until a timer")
    store.set_clock_offset(timedelta(minutes=9))
    assert store.claim(W1, LEASE) == []
    store.set_clock_offset(timedelta(minutes=11))
    claimed = claim_one(store, W2)
    assert (claimed.revision, claimed.checkpoint_json, claimed.lease.fencing_token) == (1, CHECKPOINT, 2)
    assert store.history("t1")[-1].detail == {"from_state": "waiting"}


def test_a_task_waiting_without_a_timer_is_never_claimable(store: WorkflowStore) -> None:
    enqueue(store)
    store.suspend(claim_one(store).lease, 0, CHECKPOINT, wake_at=None, reason="waiting for signal approval")
    assert store.get_task("t1").ready_at is None
    store.set_clock_offset(timedelta(days=3650))
    assert store.claim(W1, LEASE, limit=10) == []


def test_finished_tasks_are_never_claimed(store: WorkflowStore) -> None:
    enqueue(store, "done")
    enqueue(store, "failed")
    first, second = store.claim(W1, LEASE, limit=2)
    store.complete(first.lease, 0, CHECKPOINT, to_json(1))
    store.fail(second.lease, 0, None, reason="boom")
    store.set_clock_offset(timedelta(days=3650))
    assert store.claim(W1, LEASE, limit=10) == []


# --- heartbeat ----------------------------------------------------------------------


def test_a_heartbeat_extends_the_lease_from_store_now(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.set_clock_offset(timedelta(seconds=20))
    renewed = store.heartbeat(lease, LEASE)
    assert (renewed.task_id, renewed.worker_id, renewed.fencing_token) == ("t1", "worker-1", 1)
    assert close_to(renewed.expires_at, lease.expires_at + timedelta(seconds=20))
    record = store.get_task("t1")
    assert record.lease_expires == record.ready_at == renewed.expires_at
    store.set_clock_offset(timedelta(seconds=40))  # past the first expiry, inside the renewed one
    assert store.claim(W2, LEASE) == []
    assert store.commit_checkpoint(renewed, 0, CHECKPOINT).revision == 1


def test_a_heartbeat_with_a_stale_token_is_refused(store: WorkflowStore) -> None:
    enqueue(store)
    old, new = taken_over(store)
    with pytest.raises(LeaseLostError) as info:
        store.heartbeat(old, LEASE)
    assert (info.value.task_id, info.value.fencing_token, info.value.operation) == ("t1", 1, "heartbeat")
    assert store.get_task("t1").lease_expires == new.expires_at


def test_a_heartbeat_after_expiry_is_refused_even_if_nobody_reclaimed(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.set_clock_offset(timedelta(seconds=31))
    with pytest.raises(LeaseLostError):
        store.heartbeat(lease, LEASE)


# --- checkpoint commits -------------------------------------------------------------


def test_a_checkpoint_commit_stores_progress_and_raises_the_revision(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    assert store.commit_checkpoint(lease, 0, CHECKPOINT).revision == 1
    assert store.commit_checkpoint(lease, 1, LATER).revision == 2
    record = store.get_task("t1")
    assert (record.revision, record.checkpoint_json, record.state) == (2, LATER, TaskState.LEASED)
    assert kinds(store) == ["enqueued", "claimed"]  # progress is not a transition


def test_a_checkpoint_commit_on_a_stale_revision_is_refused(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.commit_checkpoint(lease, 0, CHECKPOINT)
    with pytest.raises(LeaseLostError) as info:
        store.commit_checkpoint(lease, 0, LATER)
    assert info.value.operation == "checkpoint commit"
    assert (store.get_task("t1").revision, store.get_task("t1").checkpoint_json) == (1, CHECKPOINT)


def test_a_checkpoint_commit_with_a_stale_token_is_refused(store: WorkflowStore) -> None:
    enqueue(store)
    old, _ = taken_over(store)
    with pytest.raises(LeaseLostError):
        store.commit_checkpoint(old, 0, CHECKPOINT)
    assert store.get_task("t1").revision == 0


def test_a_checkpoint_commit_after_expiry_is_refused(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.set_clock_offset(timedelta(seconds=31))
    with pytest.raises(LeaseLostError):
        store.commit_checkpoint(lease, 0, CHECKPOINT)


def test_a_checkpoint_commit_on_a_task_no_longer_leased_is_refused(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.suspend(lease, 0, CHECKPOINT, wake_at=None, reason="waiting for signal go")
    with pytest.raises(LeaseLostError):
        store.commit_checkpoint(lease, 1, LATER)
    assert store.get_task("t1").checkpoint_json == CHECKPOINT


def test_checkpoint_and_result_json_come_back_as_canonical_text(store: WorkflowStore) -> None:
    # PostgreSQL keeps these as JSONB (keys reordered, numbers as numeric); the store
    # gives back the canonical text. Integral floats of 1e16 and more are the one known
    # difference: JSONB cannot tell 1e20 from the integer 10**20 (see test_postgres_store).
    checkpoint = to_json({"z": {"y": [1.5, None, "é", 2.5e-8, -3.0], "b": 12345678.125}, "a": 0})
    result = to_json(None)
    enqueue(store)
    lease = claim_one(store).lease
    store.complete(lease, 0, checkpoint, result)
    record = store.get_task("t1")
    assert (record.checkpoint_json, record.result_json, record.result) == (checkpoint, "null", None)


# --- transitions --------------------------------------------------------------------


def test_suspend_moves_to_waiting_with_the_timer_and_reason(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    wake_at = (store.now() + timedelta(hours=2)).replace(microsecond=250000)
    store.suspend(lease, 0, CHECKPOINT, wake_at=wake_at, reason="sleeping 2h")
    record = store.get_task("t1")
    assert (record.state, record.ready_at, record.reason, record.lease_expires) == (
        TaskState.WAITING,
        wake_at,
        "sleeping 2h",
        None,
    )
    assert (record.revision, record.checkpoint_json, record.claims_since_progress) == (1, CHECKPOINT, 0)
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token, event.detail) == (
        "suspended",
        "worker-1",
        1,
        {"reason": "sleeping 2h"},
    )
    assert event.at == record.updated_at


def test_retry_requeues_after_the_delay_counted_from_store_now(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.set_clock_offset(timedelta(seconds=10))
    due = store.retry(lease, 0, CHECKPOINT, delay=timedelta(seconds=90), reason="step failed; retrying")
    record = store.get_task("t1")
    assert (record.state, record.ready_at, record.reason, record.lease_expires) == (
        TaskState.QUEUED,
        due,
        "step failed; retrying",
        None,
    )
    assert due == record.updated_at + timedelta(seconds=90)
    assert (record.revision, record.checkpoint_json, record.claims_since_progress) == (1, CHECKPOINT, 0)
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token) == ("retried", "worker-1", 1)
    assert event.detail == {"reason": "step failed; retrying", "delay_s": 90.0}
    store.set_clock_offset(timedelta(seconds=99))
    assert store.claim(W1, LEASE) == []
    store.set_clock_offset(timedelta(seconds=101))
    assert claim_one(store).lease.fencing_token == 2


def test_release_hands_the_task_back_and_refunds_the_claim(store: WorkflowStore) -> None:
    enqueue(store)
    claimed = claim_one(store)
    store.commit_checkpoint(claimed.lease, 0, CHECKPOINT)
    second = store.claim(W2, LEASE)
    assert second == []
    store.release(claimed.lease, delay=timedelta(seconds=60), reason="definition unavailable")
    record = store.get_task("t1")
    assert (record.state, record.reason, record.lease_expires) == (
        TaskState.QUEUED,
        "definition unavailable",
        None,
    )
    assert record.ready_at == record.updated_at + timedelta(seconds=60)
    assert (record.revision, record.checkpoint_json, record.claims_since_progress) == (1, CHECKPOINT, 0)
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token, event.detail) == (
        "released",
        "worker-1",
        1,
        {"reason": "definition unavailable"},
    )


def test_release_refunds_exactly_the_claim_it_ends(store: WorkflowStore) -> None:
    enqueue(store)
    claim_one(store)
    store.set_clock_offset(timedelta(seconds=31))
    lease = claim_one(store, W2).lease  # second claim without progress
    store.release(lease, delay=timedelta(0), reason="step slice used up; requeued")
    assert store.get_task("t1").claims_since_progress == 1


def test_complete_ends_the_task_with_its_result(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.complete(lease, 0, CHECKPOINT, to_json({"charge": "ch_1"}))
    record = store.get_task("t1")
    assert (record.state, record.outcome, record.reason) == (TaskState.TERMINAL, TaskOutcome.COMPLETED, None)
    assert (record.result, record.checkpoint_json, record.revision) == ({"charge": "ch_1"}, CHECKPOINT, 1)
    assert (record.ready_at, record.lease_expires) == (None, None)
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token, event.detail) == (
        "completed",
        "worker-1",
        1,
        {},
    )


def test_complete_then_claim_leases_the_next_tasks_in_the_same_transaction(store: WorkflowStore) -> None:
    for task_id, priority in (("t1", 9), ("t2", 1), ("t3", 5), ("t4", 0)):
        enqueue(store, task_id, priority=priority)
    first = claim_one(store)
    claimed = store.complete(
        first.lease, 0, CHECKPOINT, to_json(1), then_claim=ClaimRequest(W1, LEASE, limit=2)
    )
    assert [c.lease.task_id for c in claimed] == ["t3", "t2"]  # claim order, as claim() gives
    assert store.get_task("t1").state is TaskState.TERMINAL
    for c in claimed:
        record = store.get_task(c.lease.task_id)
        assert (record.state, record.worker_id, record.fencing_token) == (TaskState.LEASED, "worker-1", 1)
        assert c.lease.fencing_token == 1 and c.claims_since_progress == 1
        assert kinds(store, c.lease.task_id) == ["enqueued", "claimed"]
    assert kinds(store, "t1") == ["enqueued", "claimed", "completed"]
    assert store.get_task("t4").state is TaskState.QUEUED
    then = store.complete(claimed[0].lease, 0, CHECKPOINT, to_json(2), then_claim=ClaimRequest(W1, LEASE))
    assert [c.lease.task_id for c in then] == ["t4"]


def test_complete_without_a_claim_or_with_nothing_ready_returns_no_tasks(store: WorkflowStore) -> None:
    enqueue(store, "t1")
    enqueue(store, "t2")
    first, second = store.claim(W1, LEASE, limit=2)
    assert store.complete(first.lease, 0, CHECKPOINT, to_json(1)) == []
    assert store.complete(second.lease, 0, CHECKPOINT, to_json(1), then_claim=ClaimRequest(W1, LEASE)) == []
    assert store.get_task("t2").state is TaskState.TERMINAL


def test_a_refused_completion_claims_nothing(store: WorkflowStore) -> None:
    enqueue(store, "t1")
    enqueue(store, "t2", not_before=datetime.now(UTC) + timedelta(seconds=10))
    stale = claim_one(store).lease
    store.set_clock_offset(timedelta(seconds=31))  # t1's lease expired and t2 came due
    with pytest.raises(LeaseLostError):
        store.complete(stale, 0, CHECKPOINT, to_json(1), then_claim=ClaimRequest(W1, LEASE))
    assert store.get_task("t2").state is TaskState.QUEUED
    assert kinds(store, "t2") == ["enqueued"]
    assert store.get_task("t1").state is TaskState.LEASED  # still the expired claim


def test_complete_then_claim_refuses_a_bad_limit_before_completing(store: WorkflowStore) -> None:
    enqueue(store, "t1")
    lease = claim_one(store).lease
    with pytest.raises(InvalidArgument, match="0"):
        store.complete(lease, 0, CHECKPOINT, to_json(1), then_claim=ClaimRequest(W1, LEASE, limit=0))
    assert store.get_task("t1").state is TaskState.LEASED


def test_fail_ends_the_task_with_its_reason_and_keeps_the_checkpoint(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.commit_checkpoint(lease, 0, CHECKPOINT)
    store.fail(lease, 1, None, reason="budget max_steps=3 exceeded")
    record = store.get_task("t1")
    assert (record.state, record.outcome, record.reason) == (
        TaskState.TERMINAL,
        TaskOutcome.FAILED,
        "budget max_steps=3 exceeded",
    )
    assert (record.checkpoint_json, record.revision, record.ambiguous_effect) == (CHECKPOINT, 2, None)
    assert (record.ready_at, record.lease_expires, record.result_json) == (None, None, None)
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token, event.detail) == (
        "failed",
        "worker-1",
        1,
        {"reason": "budget max_steps=3 exceeded"},
    )


def test_fail_on_an_ambiguous_effect_records_the_effect(store: WorkflowStore) -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.fail(lease, 0, CHECKPOINT, reason="charge may have happened", ambiguous_effect="t1/charge#1")
    record = store.get_task("t1")
    assert (record.outcome, record.ambiguous_effect, record.checkpoint_json) == (
        TaskOutcome.FAILED,
        "t1/charge#1",
        CHECKPOINT,
    )
    assert store.history("t1")[-1].detail == {
        "reason": "charge may have happened",
        "ambiguous_effect": "t1/charge#1",
    }


STALE_WRITES: dict[str, Callable[[WorkflowStore, Lease], object]] = {
    "heartbeat": lambda s, lease: s.heartbeat(lease, LEASE),
    "commit_checkpoint": lambda s, lease: s.commit_checkpoint(lease, 0, CHECKPOINT),
    "suspend": lambda s, lease: s.suspend(lease, 0, CHECKPOINT, wake_at=None, reason="wait"),
    "retry": lambda s, lease: s.retry(lease, 0, CHECKPOINT, delay=timedelta(0), reason="again"),
    "release": lambda s, lease: s.release(lease, delay=timedelta(0), reason="back"),
    "complete": lambda s, lease: s.complete(lease, 0, CHECKPOINT, to_json(1)),
    "fail": lambda s, lease: s.fail(lease, 0, None, reason="no"),
    "acknowledge_cancel": lambda s, lease: s.acknowledge_cancel(lease, 0, CHECKPOINT),
    "consume_signal": lambda s, lease: s.consume_signal(lease, 0, CHECKPOINT, "s1", accepted=True, note="ok"),
}


def signalled(store: WorkflowStore) -> None:
    """Give t1 a pending signal "s1", which consume_signal needs to have anything to do."""
    store.send_signal("t1", "approval", True, signal_id="s1", sender="alice")


@pytest.mark.parametrize("operation", sorted(STALE_WRITES))
def test_every_fenced_write_with_a_stale_lease_is_refused_and_changes_nothing(
    store: WorkflowStore, operation: str
) -> None:
    enqueue(store)
    signalled(store)
    old, new = taken_over(store)
    before = store.get_task("t1")
    history = store.history("t1")
    with pytest.raises(LeaseLostError) as info:
        STALE_WRITES[operation](store, old)
    assert (info.value.task_id, info.value.fencing_token) == ("t1", 1)
    assert store.get_task("t1") == before
    assert store.history("t1") == history
    assert [s.signal_id for s in store.pending_signals("t1", "approval")] == ["s1"]
    assert (before.state, before.worker_id, before.fencing_token) == (
        TaskState.LEASED,
        "worker-2",
        new.fencing_token,
    )


@pytest.mark.parametrize("operation", sorted(set(STALE_WRITES) - {"heartbeat", "commit_checkpoint"}))
def test_a_transition_after_the_lease_expired_is_refused_and_changes_nothing(
    store: WorkflowStore, operation: str
) -> None:
    enqueue(store)
    signalled(store)
    lease = claim_one(store).lease
    store.set_clock_offset(timedelta(seconds=31))
    before = store.get_task("t1")
    history = store.history("t1")
    with pytest.raises(LeaseLostError):
        STALE_WRITES[operation](store, lease)
    assert store.get_task("t1") == before
    assert store.history("t1") == history
    assert [s.signal_id for s in store.pending_signals("t1", "approval")] == ["s1"]
    assert (before.state, before.worker_id) == (TaskState.LEASED, "worker-1")


# Writes that extend a revision, called with a held lease and the given revision.
REVISIONED_WRITES: dict[str, Callable[[WorkflowStore, Lease, int], object]] = {
    "commit_checkpoint": lambda s, lease, rev: s.commit_checkpoint(lease, rev, LATER),
    "suspend": lambda s, lease, rev: s.suspend(lease, rev, LATER, wake_at=None, reason="wait"),
    "retry": lambda s, lease, rev: s.retry(lease, rev, LATER, delay=timedelta(0), reason="again"),
    "complete": lambda s, lease, rev: s.complete(lease, rev, LATER, to_json(1)),
    "complete then claim": lambda s, lease, rev: s.complete(
        lease, rev, LATER, to_json(1), then_claim=ClaimRequest(W1, LEASE)
    ),
    "fail": lambda s, lease, rev: s.fail(lease, rev, LATER, reason="no"),
    "acknowledge_cancel": lambda s, lease, rev: s.acknowledge_cancel(lease, rev, LATER),
    "consume_signal": lambda s, lease, rev: s.consume_signal(
        lease, rev, LATER, "s1", accepted=True, note="ok"
    ),
}


@pytest.mark.parametrize("operation", sorted(REVISIONED_WRITES))
def test_every_progress_write_on_a_stale_revision_is_refused_and_changes_nothing(
    store: WorkflowStore, operation: str
) -> None:
    enqueue(store)
    enqueue(store, "t2")  # what a completion that then claims would lease
    lease = claim_one(store).lease
    signalled(store)
    if operation == "acknowledge_cancel":  # a pending cancel refuses suspend, retry and complete
        assert store.cancel("t1", actor="ops", reason="stop") is TaskState.LEASED
    assert store.commit_checkpoint(lease, 0, CHECKPOINT).revision == 1
    before = store.get_task("t1")
    history = store.history("t1")
    with pytest.raises(LeaseLostError) as info:
        REVISIONED_WRITES[operation](store, lease, 0)  # the lease holds; revision 0 is stale
    assert (info.value.task_id, info.value.fencing_token) == ("t1", 1)
    assert store.get_task("t1") == before
    assert store.history("t1") == history
    assert [s.signal_id for s in store.pending_signals("t1", "approval")] == ["s1"]
    assert (store.get_task("t2").state, kinds(store, "t2")) == (TaskState.QUEUED, ["enqueued"])
    assert (before.state, before.revision, before.checkpoint_json) == (TaskState.LEASED, 1, CHECKPOINT)
    REVISIONED_WRITES[operation](store, lease, 1)  # the current revision is accepted
    assert store.get_task("t1").revision == 2


# --- resolving ambiguous effects ----------------------------------------------------


def failed_on_effect(store: WorkflowStore, key: str = "t1/charge#1") -> None:
    enqueue(store)
    lease = claim_one(store).lease
    store.fail(lease, 0, CHECKPOINT, reason="charge interrupted", ambiguous_effect=key)


def test_resolving_the_ambiguous_effect_requeues_the_task_with_the_decision(store: WorkflowStore) -> None:
    failed_on_effect(store)
    result = to_json({"charge_id": "ch_9"})
    store.resolve_effect(
        "t1", "t1/charge#1", applied=True, result_json=result, actor="ops@example", reason="found in PSP"
    )
    record = store.get_task("t1")
    assert (record.state, record.outcome, record.ambiguous_effect) == (TaskState.QUEUED, None, None)
    assert record.reason is None
    assert record.status_note is not None and record.status_note.startswith("ready since")
    assert (record.claims_since_progress, record.ready_at) == (0, record.updated_at)
    event = store.history("t1")[-1]
    assert (event.kind, event.worker_id, event.fencing_token) == ("effect_resolved", None, None)
    assert event.detail == {
        "effect_key": "t1/charge#1",
        "applied": True,
        "actor": "ops@example",
        "reason": "found in PSP",
    }
    claimed = claim_one(store)
    assert claimed.checkpoint_json == CHECKPOINT
    assert claimed.resolutions == {
        "t1/charge#1": EffectResolution("t1/charge#1", True, result, "ops@example", "found in PSP")
    }


def test_a_not_applied_resolution_carries_no_result(store: WorkflowStore) -> None:
    failed_on_effect(store)
    store.resolve_effect(
        "t1", "t1/charge#1", applied=False, result_json=None, actor="ops", reason="not in PSP"
    )
    assert claim_one(store).resolutions["t1/charge#1"] == EffectResolution(
        "t1/charge#1", False, None, "ops", "not in PSP"
    )


def test_resolving_another_effect_than_the_one_the_task_failed_on_is_invalid(store: WorkflowStore) -> None:
    failed_on_effect(store)
    with pytest.raises(InvalidState, match="t1/refund#1"):
        store.resolve_effect("t1", "t1/refund#1", applied=True, result_json=None, actor="ops", reason="r")
    assert store.get_task("t1").state == TaskState.TERMINAL


@pytest.mark.parametrize("ending", ["queued", "completed", "failed plainly", "resolved already"])
def test_resolving_a_task_not_failed_on_an_ambiguous_effect_is_invalid(
    store: WorkflowStore, ending: str
) -> None:
    if ending == "resolved already":
        failed_on_effect(store)
        store.resolve_effect("t1", "t1/charge#1", applied=False, result_json=None, actor="ops", reason="r")
    else:
        enqueue(store)
    if ending in ("completed", "failed plainly"):
        lease = claim_one(store).lease
        if ending == "completed":
            store.complete(lease, 0, CHECKPOINT, to_json(1))
        else:
            store.fail(lease, 0, None, reason="boom")
    history = store.history("t1")
    with pytest.raises(InvalidState):
        store.resolve_effect("t1", "t1/charge#1", applied=True, result_json=None, actor="ops", reason="r")
    assert store.history("t1") == history


def test_resolving_an_unknown_task_raises_task_not_found(store: WorkflowStore) -> None:
    with pytest.raises(TaskNotFound):
        store.resolve_effect("nope", "k", applied=True, result_json=None, actor="ops", reason="r")


@pytest.mark.parametrize(
    ("applied", "actor", "reason"),
    [(True, "", "r"), (True, "ops", " "), ("yes", "ops", "r"), (1, "ops", "r")],
)
def test_a_resolution_without_actor_reason_or_a_boolean_decision_is_refused(
    store: WorkflowStore, applied: Any, actor: str, reason: str
) -> None:
    failed_on_effect(store)
    with pytest.raises(InvalidArgument):
        store.resolve_effect(
            "t1", "t1/charge#1", applied=applied, result_json=None, actor=actor, reason=reason
        )
    assert store.get_task("t1").state == TaskState.TERMINAL


@pytest.mark.parametrize(
    ("result_json", "shown"),
    [
        ("{not json", "'{not json'"),
        ("", "''"),
        ("NaN", "'NaN'"),
        ('{"charge": Infinity}', "Infinity"),
        ("[" * 101 + "]" * 101, "nests deeper than 100 levels"),
        ('"\\u0000"', "U+0000"),
        ({"charge_id": "ch_9"}, "{'charge_id': 'ch_9'}"),
        (b'{"charge_id": "ch_9"}', "b'{"),
        (1, "1"),
    ],
)
def test_a_resolution_result_that_is_not_json_text_is_refused_naming_it(
    store: WorkflowStore, result_json: Any, shown: str
) -> None:
    failed_on_effect(store)
    history = store.history("t1")
    with pytest.raises(InvalidArgument) as info:
        store.resolve_effect(
            "t1", "t1/charge#1", applied=True, result_json=result_json, actor="ops", reason="found in PSP"
        )
    assert "result_json" in str(info.value)
    assert shown in str(info.value)
    assert store.get_task("t1").state == TaskState.TERMINAL
    assert store.history("t1") == history


def test_a_resolution_result_is_kept_as_canonical_json_text(store: WorkflowStore) -> None:
    failed_on_effect(store)
    store.resolve_effect(
        "t1",
        "t1/charge#1",
        applied=True,
        result_json='{ "id": "ch_9", "amount": 5 }',
        actor="ops",
        reason="r",
    )
    resolution = claim_one(store).resolutions["t1/charge#1"]
    assert resolution.result_json == '{"amount":5,"id":"ch_9"}'


# --- reads and time -----------------------------------------------------------------


def test_get_task_of_an_unknown_id_raises_task_not_found(store: WorkflowStore) -> None:
    with pytest.raises(TaskNotFound) as info:
        store.get_task("missing")
    assert info.value.task_id == "missing"
    assert isinstance(info.value, LookupError)


def test_history_lists_every_transition_in_order(store: WorkflowStore) -> None:
    enqueue(store)
    assert store.history("other") == []
    lease = claim_one(store).lease
    store.suspend(lease, 0, CHECKPOINT, wake_at=store.now(), reason="timer")
    lease = claim_one(store).lease
    store.retry(lease, 1, CHECKPOINT, delay=timedelta(0), reason="retry")
    lease = claim_one(store).lease
    store.complete(lease, 2, LATER, to_json(True))
    events = store.history("t1")
    assert [e.kind for e in events] == [
        "enqueued",
        "claimed",
        "suspended",
        "claimed",
        "retried",
        "claimed",
        "completed",
    ]
    assert [e.fencing_token for e in events] == [None, 1, 1, 2, 2, 3, 3]
    assert [e.event_id for e in events] == sorted({e.event_id for e in events})
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert all(e.task_id == "t1" for e in events)


def test_store_time_is_aware_utc_and_moves_with_the_clock_offset(store: WorkflowStore) -> None:
    before = store.now()
    assert before.utcoffset() == timedelta(0)
    assert close_to(before, datetime.now(UTC))
    store.set_clock_offset(timedelta(hours=1))
    assert close_to(store.now(), before + timedelta(hours=1))
    store.set_clock_offset(timedelta(0))
    assert close_to(store.now(), before)


def test_the_clock_offset_is_shared_by_every_store_on_the_database(backend: Backend) -> None:
    first, second = backend.open(), backend.open()
    first.set_clock_offset(timedelta(days=2))
    assert close_to(second.now(), datetime.now(UTC) + timedelta(days=2))
