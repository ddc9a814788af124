"""Workers with disjoint registries on one store, running at once (threads, each with a
store of its own): every task is claimed only by a worker that can run it, so no claim
is handed back for a definition, version, queue or step fingerprint the worker lacks."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from runifold_sync import (
    CancellationToken,
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
from runifold_sync.store import TaskState
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

render = Workflow("render", 1)


@render.step()
def draw(ctx: StepContext, n: int) -> int:
    return n


@render.main
def render_main(ctx: WorkflowContext, n: int) -> int:
    return draw(ctx, n)


billing = Workflow("billing", 1)


@billing.step()
def charge(ctx: StepContext, n: int) -> int:
    return n


@billing.main
def billing_main(ctx: WorkflowContext, n: int) -> int:
    return charge(ctx, n)


# One version, two deploys whose steps differ (another fingerprint): each must resume
# only the tasks whose checkpoint its own steps wrote. One step per claim, so every task
# is claimed three times.
old_orders = Workflow("orders", 1)


@old_orders.step()
def reserve(ctx: StepContext, n: int) -> int:
    return n


@old_orders.step()
def ship(ctx: StepContext, n: int) -> int:
    return n


@old_orders.main
def old_orders_main(ctx: WorkflowContext, n: int) -> int:
    return ship(ctx, reserve(ctx, n))


new_orders = Workflow("orders", 1)


@new_orders.step()
def reserve_stock(ctx: StepContext, n: int) -> int:
    return n


@new_orders.step()
def dispatch(ctx: StepContext, n: int) -> int:
    return n


@new_orders.main
def new_orders_main(ctx: WorkflowContext, n: int) -> int:
    return dispatch(ctx, reserve_stock(ctx, n))


LEASE = LeaseDuration(timedelta(seconds=30))


def worker(backend: Backend, name: str, queues: tuple[str, ...], *workflows: Workflow) -> WorkflowWorker:
    registry = WorkflowRegistry()
    for workflow in workflows:
        registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(
        backend.open(),
        registry,
        WorkerId.parse(name),
        LEASE,
        timedelta(seconds=10),
        queues=queues,
        max_steps_per_claim=1,
    )


def test_workers_with_disjoint_registries_never_hand_a_claim_back(backend: Backend) -> None:
    store = backend.open()
    tasks = [WorkflowTask.new("render", 1, n, queue="gpu") for n in range(15)]
    tasks += [WorkflowTask.new("billing", 1, n) for n in range(15)]
    tasks += [WorkflowTask.new("orders", 1, n) for n in range(20)]
    store.enqueue_many(tasks)
    workers = [
        worker(backend, "render-w", ("gpu",), render, old_orders),
        worker(backend, "billing-w", ("default",), billing, new_orders),
        worker(backend, "orders-w", ("default",), old_orders),
    ]
    shutdown = CancellationToken()
    threads = [
        threading.Thread(
            target=w.run, args=(shutdown,), kwargs={"min_backoff": timedelta(milliseconds=5)}, daemon=True
        )
        for w in workers
    ]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if all(store.get_task(t.task_id).state is TaskState.TERMINAL for t in tasks):
                break
            time.sleep(0.05)
    finally:
        shutdown.cancel()
        for thread in threads:
            thread.join(10)
        for w in workers:
            w.close()
    records = {t.task_id: store.get_task(t.task_id) for t in tasks}
    assert all(r.state is TaskState.TERMINAL and r.outcome is not None for r in records.values())
    assert {r.outcome.value for r in records.values() if r.outcome is not None} == {"completed"}
    claimers: dict[str, set[str]] = {}
    for t in tasks:
        events = store.history(t.task_id)
        unavailable = [
            e for e in events if e.kind == "released" and "unavailable" in e.detail.get("reason", "")
        ]
        assert unavailable == [], (t.task_id, unavailable)
        claimers[t.definition_name] = claimers.get(t.definition_name, set()) | {
            str(e.worker_id) for e in events if e.kind == "claimed"
        }
        if t.definition_name == "orders":
            # every claim of one orders task by one fingerprint's workers
            by = {str(e.worker_id) for e in events if e.kind == "claimed"}
            assert by <= {"billing-w"} or by <= {"render-w", "orders-w"}, by
    assert claimers["render"] == {"render-w"}
    assert claimers["billing"] == {"billing-w"}
