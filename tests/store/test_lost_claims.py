"""A claim lost by a worker that lived (cut off from the store, not crashed) is taken
back from the crash-loop count, on every store: ``forgive_lost_claim`` decrements
``claims_since_progress`` once per claim, records a ``lease_lost`` event, and leaves the
count alone when progress was committed since the claim or its holder ended the lease
itself (a release already took its own claim back)."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from tests.support.backends import contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

SHORT = LeaseDuration(timedelta(seconds=4))
CUT_OFF, RESCUER = WorkerId.parse("cut-off"), WorkerId.parse("rescuer")


def _count(store: WorkflowStore, task_id: str) -> int:
    return store.get_task(task_id).claims_since_progress


def test_a_claim_lost_by_a_living_worker_is_taken_back_once_whoever_claimed_since(
    store: WorkflowStore, clock: Clock
) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    [lost] = store.claim(CUT_OFF, SHORT)
    clock.advance(SHORT.value * 2)
    [rescued] = store.claim(RESCUER, SHORT)  # taken over while the first worker was cut off
    assert _count(store, "t1") == 2
    assert store.forgive_lost_claim(lost.lease, lost.revision) is True
    assert _count(store, "t1") == 1
    assert store.forgive_lost_claim(lost.lease, lost.revision) is False  # sent again: once only
    assert _count(store, "t1") == 1
    [event] = [e for e in store.history("t1") if e.kind == "lease_lost"]
    assert (event.worker_id, event.fencing_token) == ("cut-off", lost.lease.fencing_token)
    # The rescuer's own claim still counts, and its lease still holds.
    assert store.heartbeat(rescued.lease, SHORT).fencing_token == rescued.lease.fencing_token


def test_a_lost_claim_of_an_expired_lease_nobody_took_yet_is_taken_back(
    store: WorkflowStore, clock: Clock
) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    [lost] = store.claim(CUT_OFF, SHORT)
    clock.advance(SHORT.value * 2)
    assert store.forgive_lost_claim(lost.lease, lost.revision) is True
    assert _count(store, "t1") == 0


def test_progress_committed_since_the_claim_or_a_lease_its_holder_ended_is_not_taken_back(
    store: WorkflowStore, clock: Clock
) -> None:
    store.enqueue_many(
        [WorkflowTask.new("orders", 1, None, checkpoint_id=t, priority=p) for t, p in (("t1", 1), ("t2", 0))]
    )
    [first] = store.claim(CUT_OFF, SHORT, limit=1)
    assert first.lease.task_id == "t1"
    store.commit_checkpoint(first.lease, first.revision, '{"step": 1}')  # progress: count reset
    clock.advance(SHORT.value * 2)
    store.claim(RESCUER, SHORT, limit=1)
    assert _count(store, "t1") == 1
    assert store.forgive_lost_claim(first.lease, first.revision) is False
    assert _count(store, "t1") == 1

    [second] = store.claim(CUT_OFF, SHORT, limit=1)
    store.release(second.lease, delay=timedelta(0), reason="handed back")  # took its claim back
    assert store.forgive_lost_claim(second.lease, second.revision) is False
    assert _count(store, "t2") == 0
    assert not [e for e in store.history("t2") if e.kind == "lease_lost"]


def test_leases_of_a_worker_are_its_unexpired_leases(store: WorkflowStore, clock: Clock) -> None:
    """What a worker whose claim's answer was lost reads to find the leases it does not
    know of."""
    store.enqueue_many([WorkflowTask.new("orders", 1, None, checkpoint_id=t) for t in ("t1", "t2", "t3")])
    mine = store.claim(CUT_OFF, SHORT, limit=2)
    store.claim(RESCUER, SHORT, limit=1)
    held = store.leases_of(CUT_OFF)
    assert sorted((lease.task_id, lease.fencing_token) for lease in held) == sorted(
        (c.lease.task_id, c.lease.fencing_token) for c in mine
    )
    assert all(lease.worker_id == "cut-off" and lease.tenant == "default" for lease in held)
    clock.advance(SHORT.value * 2)
    assert store.leases_of(CUT_OFF) == []
