"""A task whose worker vanished is taken over before new work of the same priority, on
every store: its expired lease does not wait behind the queue (with 18 tasks queued the
takeover took 39.5 s instead of about one 4 s lease). Priority still comes first."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.store.records import Routes
from tests.support.backends import contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

SHORT = LeaseDuration(timedelta(seconds=4))
LEASE = LeaseDuration(timedelta(seconds=30))
VANISHED, RESCUER = WorkerId.parse("vanished"), WorkerId.parse("rescuer")
ORDERS = Routes.serving(["default"], [("orders", 1, "fp-a")])


def task(task_id: str, priority: int = 0) -> WorkflowTask:
    return WorkflowTask.new("orders", 1, {"id": task_id}, checkpoint_id=task_id, priority=priority)


@pytest.mark.parametrize("routes", [ORDERS, None], ids=["routed", "any"])
def test_an_expired_lease_is_claimed_before_the_queued_tasks_of_its_priority(
    store: WorkflowStore, clock: Clock, routes: Routes | None
) -> None:
    store.enqueue(task("lost"))
    [lost] = store.claim(VANISHED, SHORT, routes=routes)
    for n in range(18):
        store.enqueue(task(f"queued-{n:02d}"))
        clock.advance(timedelta(milliseconds=10))
    clock.advance(SHORT.value)
    [first] = store.claim(RESCUER, LEASE, routes=routes)
    assert first.lease.task_id == "lost"
    assert first.lease.fencing_token == lost.lease.fencing_token + 1
    # Then the queue, in its own order.
    assert [c.lease.task_id for c in store.claim(RESCUER, LEASE, limit=3, routes=routes)] == [
        "queued-00",
        "queued-01",
        "queued-02",
    ]


@pytest.mark.parametrize("routes", [ORDERS, None], ids=["routed", "any"])
def test_priority_still_comes_before_an_expired_lease_and_a_batch_takes_it_first(
    store: WorkflowStore, clock: Clock, routes: Routes | None
) -> None:
    store.enqueue(task("lost"))
    store.claim(VANISHED, SHORT, routes=routes)
    store.enqueue_many([task("urgent", priority=5), task("older")])
    clock.advance(timedelta(seconds=1))
    store.enqueue(task("newer"))
    clock.advance(SHORT.value)
    claimed = store.claim(RESCUER, LEASE, limit=3, routes=routes)
    assert [c.lease.task_id for c in claimed] == ["urgent", "lost", "older"]
