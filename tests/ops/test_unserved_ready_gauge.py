"""``runifold_unserved_ready_tasks{queue, definition, version}`` on every backend: ready
tasks (queued, due, not paused) that no live worker can claim, counted per queue and
version at the scrape; a route drops to 0 once a worker that claims it registers, and
tasks not ready (scheduled later, paused, waiting) are not counted."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import CollectorRegistry

from runifold_sync import WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.ops.metrics import StoreCollector
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

GAUGE = "runifold_unserved_ready_tasks"


def _series(registry: CollectorRegistry) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["queue"], s.labels["definition"], s.labels["version"]): s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == GAUGE
    }


def test_ready_work_no_live_worker_serves_is_gauged_by_queue_and_version_until_one_registers(
    store: WorkflowStore,
) -> None:
    registry = CollectorRegistry()
    registry.register(StoreCollector(store))
    store.enqueue_many([WorkflowTask.new("render", 1, n, queue="render") for n in range(3)])
    store.enqueue_many([WorkflowTask.new("orders", 2, n) for n in range(2)])
    later = store.now() + timedelta(hours=1)
    store.enqueue(WorkflowTask.new("orders", 2, "later", not_before=later))
    held = store.enqueue(WorkflowTask.new("orders", 2, "held")).task_id
    store.pause(held, actor="alice", reason="checking it")
    store.enqueue(WorkflowTask.new("billing", 1, "later", not_before=later))  # nothing ready

    assert _series(registry) == {("render", "render", "1"): 3, ("default", "orders", "2"): 2}

    store.register_worker(WorkerId.parse("orders"), host="h", pid=1, definitions=[("orders", 2)])
    assert _series(registry) == {("render", "render", "1"): 3, ("default", "orders", "2"): 0}
    # Serving the version on another queue does not serve it.
    store.register_worker(WorkerId.parse("wrong-queue"), host="h", pid=2, definitions=[("render", 1)])
    assert _series(registry)[("render", "render", "1")] == 3
    store.register_worker(
        WorkerId.parse("render"), host="h", pid=3, definitions=[("render", 1)], queues=("render",)
    )
    assert _series(registry) == {("render", "render", "1"): 0, ("default", "orders", "2"): 0}

    store.worker_stopped(WorkerId.parse("render"), 3)
    assert _series(registry)[("render", "render", "1")] == 3
    assert [b.ready for b in store.routed_backlog() if b.name == "billing"] == [0]
