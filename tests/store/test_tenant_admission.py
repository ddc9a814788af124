"""Tenant admission and fair claiming in the store contract, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import EnqueueConflict, InvalidArgument
from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskState, TenantBudget, TenantPolicy
from runifold_sync.store.records import ClaimRequest
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")
HOUR = timedelta(hours=1)


def task(task_id: str, tenant: str, **options: Any) -> WorkflowTask:
    return WorkflowTask.new("orders", 1, {"id": task_id}, checkpoint_id=task_id, tenant=tenant, **options)


def enqueue(store: WorkflowStore, tenant: str, count: int, prefix: str | None = None) -> list[str]:
    ids = [f"{prefix or tenant}-{n}" for n in range(count)]
    store.enqueue_many([task(i, tenant) for i in ids])
    return ids


def claimed_ids(store: WorkflowStore, limit: int = 1) -> list[str]:
    return [c.lease.task_id for c in store.claim(W1, LEASE, limit=limit)]


def with_cost(cost: float) -> str:
    return to_json({"phase": "running", "usage": {"steps": 1, "cost": cost}})


# --- fairness --------------------------------------------------------------------------


def test_a_quiet_tenants_new_task_is_claimed_next_despite_a_hot_backlog(store: WorkflowStore) -> None:
    enqueue(store, "hot", 200)
    assert claimed_ids(store) == ["hot-0"]
    store.enqueue(task("quiet-0", "quiet"))
    # hot was served last, so the quiet tenant's task is next, not after 199 older ones.
    assert claimed_ids(store) == ["quiet-0"]
    assert claimed_ids(store) == ["hot-1"]


def test_a_batch_claim_takes_every_tenants_first_task_before_any_second(store: WorkflowStore) -> None:
    enqueue(store, "a", 5)
    enqueue(store, "b", 5)
    enqueue(store, "c", 1)
    first = claimed_ids(store, limit=3)
    assert sorted(first) == ["a-0", "b-0", "c-0"]
    second = claimed_ids(store, limit=4)
    assert Counter(i.split("-")[0] for i in second) == {"a": 2, "b": 2}


def test_priority_orders_tasks_within_a_tenant(store: WorkflowStore) -> None:
    store.enqueue(task("low", "a"))
    store.enqueue(task("high", "a", priority=9))
    assert claimed_ids(store) == ["high"]


# --- lease limits ----------------------------------------------------------------------


def test_claims_skip_a_tenant_at_its_lease_limit_and_resume_when_a_lease_ends(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", max_leased=2))
    enqueue(store, "acme", 5)
    enqueue(store, "other", 3)
    taken = store.claim(W1, LEASE, limit=10)
    assert Counter(c.lease.tenant for c in taken) == {"acme": 2, "other": 3}
    assert claimed_ids(store, limit=10) == []
    acme = next(c for c in taken if c.lease.tenant == "acme")
    store.complete(acme.lease, acme.revision, with_cost(0), "null")
    assert claimed_ids(store, limit=10) == ["acme-2"]


def test_a_completion_that_claims_next_sees_its_own_lease_ended(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", max_leased=1))
    enqueue(store, "acme", 2)
    (first,) = store.claim(W1, LEASE)
    then = store.complete(
        first.lease, first.revision, with_cost(0), "null", then_claim=ClaimRequest(W1, LEASE, 5)
    )
    assert [c.lease.task_id for c in then] == ["acme-1"]  # room again, and still only one


def test_an_expired_lease_does_not_count_against_the_limit(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", max_leased=1))
    enqueue(store, "acme", 2)
    assert claimed_ids(store, limit=5) == ["acme-0"]
    store.set_clock_offset(timedelta(seconds=31))  # acme-0's lease expired
    assert len(claimed_ids(store, limit=5)) == 1  # the expired lease left room for one
    assert claimed_ids(store, limit=5) == []


def test_a_limit_of_zero_pauses_a_tenant_and_clearing_the_policy_resumes_it(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", max_leased=0))
    enqueue(store, "acme", 1)
    assert claimed_ids(store) == []
    store.set_tenant_policy(TenantPolicy("acme"))
    assert claimed_ids(store) == ["acme-0"]
    assert store.tenant_admission() == []


def test_a_held_task_says_it_is_queued_behind_its_tenant_limit(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", max_leased=1))
    enqueue(store, "acme", 2)
    claimed_ids(store)
    record = store.get_task("acme-1")
    assert record.state is TaskState.QUEUED
    assert record.status_note == "queued behind tenant limit: tenant 'acme' has 1 of 1 allowed tasks leased"
    assert record.reason is None
    listed = {r.task_id: r.status_note for r in store.list_tasks(tenant="acme")}
    assert listed["acme-1"] == record.status_note
    assert (listed["acme-0"] or "").startswith("running on worker-1 (fencing token 1), lease until")
    (admission,) = store.tenant_admission()
    assert (admission.policy.tenant, admission.leased, admission.ready, admission.held) == ("acme", 1, 1, 1)


def test_concurrent_claimers_never_lease_more_than_the_limit(backend: Backend) -> None:
    store = backend.open()
    store.set_tenant_policy(TenantPolicy("acme", max_leased=3))
    enqueue(store, "acme", 40)
    stores = [backend.open() for _ in range(6)]
    barrier = threading.Barrier(len(stores))
    leased: list[int] = []

    def claim_repeatedly(own: WorkflowStore) -> None:
        barrier.wait()
        for _ in range(15):
            own.claim(WorkerId.parse(f"w-{id(own)}"), LEASE, limit=2)
            leased.append(len(own.list_tasks(state=TaskState.LEASED, limit=100)))

    threads = [threading.Thread(target=claim_repeatedly, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(leased) == 3
    assert len(store.list_tasks(state=TaskState.LEASED)) == 3


# --- budget admission ------------------------------------------------------------------


def test_a_tenant_over_its_budget_is_deferred_not_failed_until_charges_leave_the_window(
    store: WorkflowStore,
) -> None:
    store.set_tenant_policy(TenantPolicy("acme", budget=TenantBudget(10, HOUR)))
    enqueue(store, "acme", 3)
    (first,) = store.claim(W1, LEASE)
    revision = store.commit_checkpoint(first.lease, first.revision, with_cost(4)).revision
    store.complete(first.lease, revision, with_cost(12), "null")  # 12 charged in all
    assert claimed_ids(store) == []
    record = store.get_task("acme-1")
    assert record.state is TaskState.QUEUED and record.outcome is None
    assert record.status_note is not None
    assert record.status_note.startswith("deferred by budget admission: tenant 'acme' charged 12 of 10")
    (admission,) = store.tenant_admission()
    assert (admission.spent, admission.over_budget, admission.held) == (12.0, True, 2)
    store.set_clock_offset(HOUR + timedelta(seconds=1))
    assert claimed_ids(store) == ["acme-1"]
    assert store.tenant_admission()[0].spent == 0


def test_only_the_growth_of_a_tasks_cost_is_charged(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", budget=TenantBudget(100, HOUR)))
    enqueue(store, "acme", 1)
    (claimed,) = store.claim(W1, LEASE)
    revision = claimed.revision
    for cost in (3, 3, 5, 5):
        revision = store.commit_checkpoint(claimed.lease, revision, with_cost(cost)).revision
    assert store.tenant_admission()[0].spent == 5


def test_another_tenants_budget_does_not_hold_this_one(store: WorkflowStore) -> None:
    store.set_tenant_policy(TenantPolicy("acme", budget=TenantBudget(0, HOUR)))
    enqueue(store, "acme", 1)
    enqueue(store, "other", 1)
    assert claimed_ids(store, limit=5) == ["other-0"]


# --- arguments and batches -------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: TenantPolicy(""),
        lambda: TenantPolicy("acme", max_leased=-1),
        lambda: TenantPolicy("acme", max_leased=True),
        lambda: TenantPolicy("acme", budget=10),
        lambda: TenantBudget(-1, HOUR),
        lambda: TenantBudget(float("nan"), HOUR),
        lambda: TenantBudget(5, timedelta(0)),
    ],
)
def test_bad_policies_are_refused_naming_the_value(make: Any) -> None:
    with pytest.raises(InvalidArgument):
        make()


def test_set_tenant_policy_refuses_anything_but_a_policy(store: WorkflowStore) -> None:
    with pytest.raises(InvalidArgument, match="TenantPolicy"):
        store.set_tenant_policy("acme")  # type: ignore[arg-type]


def test_enqueue_many_is_all_or_nothing(store: WorkflowStore) -> None:
    store.enqueue(task("a-0", "a"))
    results = store.enqueue_many([task("a-0", "a"), task("a-1", "a")])
    assert [(r.task_id, r.created) for r in results] == [("a-0", False), ("a-1", True)]
    conflicting = WorkflowTask.new("orders", 2, {"id": "a-0"}, checkpoint_id="a-0", tenant="a")
    with pytest.raises(EnqueueConflict):
        store.enqueue_many([task("a-2", "a"), conflicting])
    assert [r.task_id for r in store.list_tasks()] == ["a-0", "a-1"]
    with pytest.raises(InvalidArgument, match="twice"):
        store.enqueue_many([task("b-0", "b"), task("b-0", "b")])
    assert store.enqueue_many([]) == []
