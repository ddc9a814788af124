"""Handing back the leases of a worker whose process is gone (a pool's supervisor reaped
it), on SQLite and PostgreSQL: each task is claimable at once rather than after its
lease, fenced by the lease's token and the dead worker's id like any write of a lease
holder, and the next claim is counted as a claim after an expired lease is."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument, LeaseLostError
from runifold_sync.model.codec import to_json
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
DEAD = WorkerId.parse("pool-0")
NEXT = WorkerId.parse("pool-0.1")
OTHER = WorkerId.parse("pool-1")
REASON = "worker pool-0 (pid 4242) died: killed by SIGKILL"


def enqueue(store: WorkflowStore, *task_ids: str) -> None:
    for task_id in task_ids:
        store.enqueue(WorkflowTask.new("orders", 1, {"order_id": task_id}, checkpoint_id=task_id))


def test_the_leases_a_worker_holds_are_listed_with_their_tokens(store: WorkflowStore) -> None:
    enqueue(store, "t1", "t2", "t3")
    held = store.claim(DEAD, LEASE, limit=2)
    store.claim(OTHER, LEASE)
    leases = store.leases_held_by(DEAD)
    assert leases == sorted((c.lease for c in held), key=lambda lease: lease.task_id)
    assert {lease.worker_id for lease in leases} == {"pool-0"}
    store.set_clock_offset(timedelta(seconds=31))  # expired leases are held by nobody
    assert store.leases_held_by(DEAD) == []


def test_handed_back_leases_are_claimable_at_once_and_the_claim_names_the_dead_owner(
    store: WorkflowStore,
) -> None:
    enqueue(store, "t1", "t2")
    store.claim(DEAD, LEASE, limit=2)
    assert store.claim(NEXT, LEASE) == []  # leased for 30 s more

    assert store.hand_back_dead_leases(DEAD, store.leases_held_by(DEAD), reason=REASON) == ["t1", "t2"]

    assert store.leases_held_by(DEAD) == []
    claimed = store.claim(NEXT, LEASE, limit=2)
    assert [(c.lease.task_id, c.lease.fencing_token, c.claims_since_progress) for c in claimed] == [
        ("t1", 2, 2),  # the dead worker's claim counted as an attempt
        ("t2", 2, 2),
    ]
    handed, reclaimed = store.history("t1")[-2:]
    assert (handed.kind, handed.worker_id, handed.fencing_token, handed.detail) == (
        "handed_back",
        "pool-0",
        1,
        {"reason": REASON},
    )
    assert (reclaimed.kind, reclaimed.worker_id) == ("claimed", "pool-0.1")
    assert reclaimed.detail == {"from_state": "leased", "expired_owner": "pool-0"}


def test_a_hand_back_under_a_token_that_is_no_longer_current_is_refused(store: WorkflowStore) -> None:
    enqueue(store, "t1")
    (old,) = store.claim(DEAD, LEASE)
    store.set_clock_offset(timedelta(seconds=31))
    (new,) = store.claim(OTHER, LEASE)  # the lease ran out and another worker took the task

    assert store.hand_back_dead_leases(DEAD, [old.lease], reason=REASON) == []

    # The new owner's lease is untouched: it extends and completes as if nothing happened.
    renewed = store.heartbeat(new.lease, LEASE)
    assert renewed.expires_at > store.now() + timedelta(seconds=25)
    assert store.claim(NEXT, LEASE) == []
    store.complete(new.lease, 0, to_json({"phase": "done"}), to_json("ok"))
    assert [e.kind for e in store.history("t1")].count("handed_back") == 0


def test_a_hand_back_of_a_lease_the_same_worker_claimed_again_is_refused(store: WorkflowStore) -> None:
    """The token, not the worker id alone, fences it: an older claim's lease is stale
    even when the same worker holds the task under a newer one."""
    enqueue(store, "t1")
    (first,) = store.claim(DEAD, LEASE)
    store.release(first.lease, delay=timedelta(0), reason="yielded")
    (second,) = store.claim(DEAD, LEASE)
    assert store.hand_back_dead_leases(DEAD, [first.lease], reason=REASON) == []
    store.heartbeat(second.lease, LEASE)  # still held


def test_a_hand_back_after_the_task_ended_changes_nothing(store: WorkflowStore) -> None:
    enqueue(store, "t1")
    (claimed,) = store.claim(DEAD, LEASE)
    store.complete(claimed.lease, 0, to_json({"phase": "done"}), to_json("ok"))
    assert store.hand_back_dead_leases(DEAD, [claimed.lease], reason=REASON) == []
    assert store.get_task("t1").result == "ok"


def test_the_dead_worker_can_write_nothing_more_once_its_task_is_claimed_again(store: WorkflowStore) -> None:
    enqueue(store, "t1")
    (claimed,) = store.claim(DEAD, LEASE)
    store.hand_back_dead_leases(DEAD, [claimed.lease], reason=REASON)
    store.claim(NEXT, LEASE)
    with pytest.raises(LeaseLostError):
        store.heartbeat(claimed.lease, LEASE)
    with pytest.raises(LeaseLostError):
        store.commit_checkpoint(claimed.lease, 0, to_json({"phase": "running"}))


def test_leases_of_another_worker_are_refused_naming_the_worker(store: WorkflowStore) -> None:
    enqueue(store, "t1")
    (claimed,) = store.claim(OTHER, LEASE)
    with pytest.raises(InvalidArgument, match="leases must be Leases held by worker pool-0"):
        store.hand_back_dead_leases(DEAD, [claimed.lease], reason=REASON)
    with pytest.raises(InvalidArgument, match="worker_id must be a WorkerId"):
        store.hand_back_dead_leases("pool-1", [claimed.lease], reason=REASON)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="worker_id must be a WorkerId"):
        store.leases_held_by("pool-1")  # type: ignore[arg-type]
    store.heartbeat(claimed.lease, LEASE)  # nothing was handed back
