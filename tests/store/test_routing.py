"""Routing and named queues in the store contract, on SQLite and PostgreSQL: a claim with
a worker's routes takes only the tasks it can run (queue, name, version and, once a task
has a head, fingerprint); the idle wait looks only at their due times; a claim without
routes takes anything, as before."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import LeaseDuration, Settings, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import EnqueueConflict, InvalidArgument
from runifold_sync.model.codec import to_json
from runifold_sync.store import TenantPolicy
from runifold_sync.store.records import ClaimRequest, Routes
from runifold_sync.worker.settings import WorkerSettings
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
ORDERS = Routes.serving(["default"], [("orders", 1, "fp-a")])


def task(task_id: str, name: str = "orders", version: int = 1, **options: Any) -> WorkflowTask:
    return WorkflowTask.new(name, version, {"id": task_id}, checkpoint_id=task_id, **options)


def claimed(store: WorkflowStore, routes: Routes | None, limit: int = 10) -> list[str]:
    return sorted(c.lease.task_id for c in store.claim(W1, LEASE, limit=limit, routes=routes))


def head(fingerprint: str) -> str:
    return to_json({"definition": {"name": "orders", "version": 1, "fingerprint": fingerprint}})


def test_a_routed_claim_takes_only_the_names_and_versions_its_registry_serves(store: WorkflowStore) -> None:
    store.enqueue_many([task("o1"), task("o2", version=2), task("b1", name="billing")])
    assert claimed(store, ORDERS) == ["o1"]
    assert claimed(store, ORDERS) == []
    billing = Routes.serving(["default"], [("billing", 1, "fp-b"), ("orders", 2, "fp-c")])
    assert claimed(store, billing) == ["b1", "o2"]


def test_a_routed_claim_takes_only_tasks_of_its_queues(store: WorkflowStore) -> None:
    store.enqueue_many([task("d1"), task("r1", queue="render"), task("x1", queue="export")])
    assert claimed(store, ORDERS) == ["d1"]
    both = Routes.serving(["render", "export"], [("orders", 1, "fp-a")])
    assert claimed(store, both) == ["r1", "x1"]
    assert store.get_task("r1").queue == "render"
    assert [t.task_id for t in store.list_tasks(queue="export")] == ["x1"]


def test_a_claim_without_routes_takes_any_task_as_before(store: WorkflowStore) -> None:
    store.enqueue_many([task("o1"), task("b1", name="billing"), task("r1", queue="render")])
    assert claimed(store, None) == ["b1", "o1", "r1"]


def test_once_a_task_has_a_head_only_the_fingerprint_it_was_claimed_with_takes_it(
    store: WorkflowStore,
) -> None:
    store.enqueue(task("t1"))
    other = Routes.serving(["default"], [("orders", 1, "fp-b")])
    [first] = store.claim(W1, LEASE, routes=ORDERS)
    assert store.get_task("t1").fingerprint == "fp-a"
    store.commit_checkpoint(first.lease, first.revision, head("fp-a"))
    store.release(first.lease, delay=timedelta(0), reason="test")
    assert claimed(store, other) == []
    assert store.wait_for_work(timedelta(0), other) is False
    assert store.wait_for_work(timedelta(0), ORDERS) is True
    assert claimed(store, ORDERS) == ["t1"]


def test_a_task_handed_back_before_its_first_checkpoint_is_anyones_and_takes_the_next_fingerprint(
    store: WorkflowStore,
) -> None:
    store.enqueue(task("t1"))
    [first] = store.claim(W1, LEASE, routes=ORDERS)
    store.release(first.lease, delay=timedelta(0), reason="test")
    other = Routes.serving(["default"], [("orders", 1, "fp-b")])
    assert claimed(store, other) == ["t1"]
    assert store.get_task("t1").fingerprint == "fp-b"


def test_the_idle_wait_ignores_due_work_the_routes_cannot_claim(store: WorkflowStore) -> None:
    store.enqueue_many([task("b1", name="billing"), task("r1", queue="render")])
    assert store.wait_for_work(timedelta(0)) is True
    assert store.wait_for_work(timedelta(0), ORDERS) is False
    store.enqueue(task("o1", not_before=store.now() + timedelta(seconds=0.3)))
    assert store.wait_for_work(timedelta(0), ORDERS) is False
    assert store.wait_for_work(timedelta(seconds=5), ORDERS) is True


def test_tenant_turns_hold_within_the_served_set(store: WorkflowStore) -> None:
    store.enqueue_many([task(f"hot-{n}", tenant="hot") for n in range(6)])
    store.enqueue_many([task(f"hot-b{n}", name="billing", tenant="hot") for n in range(6)])
    store.enqueue_many([task(f"quiet-b{n}", name="billing", tenant="quiet") for n in range(3)])
    store.enqueue_many([task(f"quiet-{n}", tenant="quiet") for n in range(2)])
    taken = [c.lease.task_id for c in store.claim(W1, LEASE, limit=4, routes=ORDERS)]
    # every tenant's first served task before any tenant's second; billing never
    assert sorted(taken[:2]) == ["hot-0", "quiet-0"]
    assert sorted(taken[2:]) == ["hot-1", "quiet-1"]


def test_admission_limits_hold_within_the_served_set(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", max_leased=2))
    store.enqueue_many([task(f"b{n}", name="billing", tenant="acme") for n in range(3)])
    store.enqueue_many([task(f"o{n}", tenant="acme") for n in range(3)])
    billing = Routes.serving(["default"], [("billing", 1, "fp-b")])
    assert claimed(store, billing, limit=1) == ["b0"]
    assert claimed(store, ORDERS) == ["o0"]  # one lease left under the limit
    assert claimed(store, ORDERS) == []


def test_a_completion_claims_the_next_task_within_its_routes(store: WorkflowStore) -> None:
    store.enqueue_many([task("o1"), task("b1", name="billing"), task("o2")])
    [first] = store.claim(W1, LEASE, routes=ORDERS)
    request = ClaimRequest(W1, LEASE, 5, ORDERS)
    nxt = store.complete(first.lease, first.revision, head("fp-a"), "null", then_claim=request)
    assert [c.lease.task_id for c in nxt] == ["o2"]


def test_the_queue_is_part_of_what_enqueue_compares(store: WorkflowStore) -> None:
    store.enqueue(task("t1", queue="render"))
    assert not store.enqueue(task("t1", queue="render")).created
    with pytest.raises(EnqueueConflict, match="queue"):
        store.enqueue(task("t1"))


def test_routes_and_queue_names_are_checked() -> None:
    with pytest.raises(InvalidArgument, match="at least one queue"):
        Routes.serving([], [])
    with pytest.raises(InvalidArgument, match="string"):
        Routes.serving("default", [])
    with pytest.raises(InvalidArgument, match="queue"):
        WorkflowTask.new("orders", 1, None, queue=" x")
    assert WorkerSettings(queues=["gpu", "default"]).queues == ("gpu", "default")
    for bad in ((), "default", ("",)):
        with pytest.raises(InvalidArgument, match="queue"):
            WorkerSettings(queues=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="RUNIFOLD_QUEUES"):
        Settings.from_mapping({"RUNIFOLD_QUEUES": "gpu, "})
    assert Settings.from_mapping({"RUNIFOLD_QUEUES": "gpu,default"}).worker.queues == (
        "gpu",
        "default",
    )


def test_a_task_checkpointed_under_a_claim_without_routes_is_routed_by_its_head_after_one_claim(
    store: WorkflowStore,
) -> None:
    store.enqueue(task("t1"))
    [first] = store.claim(W1, LEASE)  # a tool's claim: no fingerprint recorded
    store.commit_checkpoint(first.lease, first.revision, head("fp-a"))
    store.release(first.lease, delay=timedelta(0), reason="test")
    assert store.get_task("t1").fingerprint is None
    other = Routes.serving(["default"], [("orders", 1, "fp-b")])
    [second] = store.claim(W1, LEASE, routes=other)  # the race the worker's hand-back catches
    assert store.get_task("t1").fingerprint == "fp-a"  # from its head, from now on
    store.release(second.lease, delay=timedelta(0), reason="test")
    assert claimed(store, other) == []
    assert claimed(store, ORDERS) == ["t1"]


def test_queue_and_definition_names_with_quotes_backslashes_and_percent_signs_route(
    store: WorkflowStore,
) -> None:
    odd = "it's \\ 100% 'odd'"
    store.enqueue_many([task("t1", name=odd, queue=odd), task("t2", queue=odd), task("t3")])
    routes = Routes.serving([odd], [(odd, 1, "fp's %s \\")])
    assert claimed(store, routes) == ["t1"]
    assert store.get_task("t1").fingerprint == "fp's %s \\"
