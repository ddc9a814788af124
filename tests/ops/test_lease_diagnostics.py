"""The four readings a rise in lease losses calls for, as ``PrometheusObserver`` records
them from a real worker on a real store: each store operation's duration, the waits for
a connection or the database lock, each heartbeat's lateness and the lease it had left,
and the heartbeat thread's wake-up drift, which shows a step holding the GIL. (A worker
frozen with SIGSTOP shows in the same metrics: ``test_metrics_endpoint.py``.)"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

from prometheus_client import CollectorRegistry

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.engine.claim import Claim
from runifold_sync.ops.metrics import PrometheusObserver
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.worker.heartbeat import LeaseKeeper
from tests.support import processes

W1 = WorkerId.parse("w1")


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def over(registry: CollectorRegistry, metric: str, le: str) -> float:
    """Observations of histogram ``metric`` above the bucket bound ``le``."""
    return value(registry, f"{metric}_count") - value(registry, f"{metric}_bucket", le=le)


def hold_the_gil(seconds: float) -> float:
    """Keep the GIL for ``seconds`` of CPU-bound Python, as a step starving the other
    threads does: with a switch interval longer than that, a waiting thread never gets
    the GIL handed over. Returns the seconds it was held."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(seconds * 4)
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            pass
    finally:
        sys.setswitchinterval(interval)
    return time.perf_counter() - started


def test_a_step_holding_the_gil_shows_as_a_runtime_stall_and_a_late_heartbeat(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    registry = CollectorRegistry()
    observer = PrometheusObserver(registry)
    sqlite_store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    lease = LeaseDuration(timedelta(seconds=4))
    [claimed] = sqlite_store.claim(W1, lease)
    keeper = LeaseKeeper(sqlite_store, lease, 0.5, "beats", observer)
    keeper.watch(Claim(claimed))
    beats = lambda: value(registry, "runifold_heartbeat_lateness_seconds_count")  # noqa: E731
    try:
        processes.wait_until(lambda: beats() >= 2, 10, "two beats on schedule")
        assert over(registry, "runifold_runtime_stall_seconds", "1.0") == 0
        assert value(registry, "runifold_heartbeat_lease_left_seconds_bucket", le="2.5") == 0
        # Just after a beat the thread is asleep until the next one, due in the hold.
        time.sleep(0.05)
        hold_the_gil(2.0)  # the beat due 0.5 s after the last comes 1.5 s late or more
        processes.wait_until(lambda: beats() >= 3, 10, "the beat after the hold")
    finally:
        keeper.close()
    assert over(registry, "runifold_runtime_stall_seconds", "1.0") >= 1
    assert over(registry, "runifold_heartbeat_lateness_seconds", "1.0") >= 1
    # That beat found the lease spent further than any on schedule (3.5 s left of 4).
    assert value(registry, "runifold_heartbeat_lease_left_seconds_bucket", le="2.5") >= 1
    assert value(registry, "runifold_store_pool_requests_total") > 0


def test_a_worker_times_each_store_operation_it_makes(sqlite_store: SqliteWorkflowStore) -> None:
    registry = CollectorRegistry()
    wf = Workflow("two-steps", 1)

    @wf.step()
    def add(ctx: object, value: int) -> int:
        return value + 1

    @wf.main
    def main(ctx: WorkflowContext, value: int) -> int:
        return add(ctx, add(ctx, value))

    definitions = WorkflowRegistry()
    definitions.register(WorkflowDefinition(wf))
    sqlite_store.enqueue(WorkflowTask.new("two-steps", 1, 1))
    worker = WorkflowWorker(
        sqlite_store,
        definitions,
        W1,
        LeaseDuration(timedelta(seconds=30)),
        observer=PrometheusObserver(registry),
    )
    try:
        worker.run_once()
    finally:
        worker.close()
    counts = {
        operation: value(registry, "runifold_store_operation_seconds_count", operation=operation)
        for operation in ("register_worker", "claim", "commit_checkpoint", "complete")
    }
    assert counts == {"register_worker": 1, "claim": 1, "commit_checkpoint": 1, "complete": 1}
    assert value(registry, "runifold_store_operation_seconds_sum", operation="claim") > 0


def test_a_write_that_waited_for_the_sqlite_lock_is_counted_with_its_wait(sqlite_path: Path) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    store.pool_waits()  # from here on
    holder = sqlite3.connect(sqlite_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
    release.start()
    store.enqueue(WorkflowTask.new("orders", 1, {}))
    release.join()
    holder.close()
    waits = store.pool_waits()
    assert waits.requests >= 1 and waits.waited == 1
    assert 0.25 <= waits.wait_s < 5
    assert store.pool_waits().requests == 0  # taken: the count starts again
    store.close()
