"""``queue_stats`` reads unfinished tasks from their partial indexes and finished ones from
counters kept by triggers (migration 24): on every backend its counts equal a count of
the tasks themselves after every way a task ends, comes back (an operator's requeue) or
goes (prune), tenant by tenant."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.model.codec import to_json
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.records import Completion
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")


def _counted(store: WorkflowStore) -> Counter[tuple[str, TaskState, TaskOutcome | None]]:
    return Counter({(s.tenant, s.state, s.outcome): s.count for s in store.queue_stats()})


def _truth(store: WorkflowStore) -> Counter[tuple[str, TaskState, TaskOutcome | None]]:
    return Counter((t.tenant, t.state, t.outcome) for t in store.list_tasks(limit=1000))


def _finish(store: WorkflowStore, how: str) -> str:
    """Claim the next task and end it ``how``; its id."""
    (claimed,) = store.claim(W1, LEASE)
    if how == "complete":
        store.complete(claimed.lease, claimed.revision, to_json({}), to_json(None))
    else:
        store.fail(claimed.lease, claimed.revision, None, reason="boom")
    return claimed.lease.task_id


def test_finished_counts_follow_every_end_requeue_and_prune(store: WorkflowStore) -> None:
    tasks = [
        WorkflowTask.new(
            "orders", 1, {"n": n}, checkpoint_id=f"t{n:02}", tenant="acme" if n % 3 else "globex"
        )
        for n in range(12)
    ]
    store.enqueue_many(tasks)
    assert _counted(store) == _truth(store)
    failed = [_finish(store, "fail") for _ in range(3)]
    done = [_finish(store, "complete") for _ in range(4)]
    store.cancel("t11", actor="ops", reason="not needed")
    assert _counted(store) == _truth(store)
    assert sum(s.count for s in store.queue_stats() if s.state is TaskState.TERMINAL) == 7
    store.requeue(failed[0], actor="ops", reason="fixed")  # failed -> queued: one fewer failed
    assert _counted(store) == _truth(store)
    _finish(store, "complete")
    store.set_clock_offset(timedelta(days=2))
    assert store.prune(timedelta(days=1), batch=2) == 8
    assert store.list_tasks(state=TaskState.TERMINAL) == []
    assert _counted(store) == _truth(store)
    assert not any(s.state in (TaskState.TERMINAL, TaskState.CANCELLED) for s in store.queue_stats())
    assert done  # each completion above was counted, then pruned


def test_a_waiting_task_without_a_due_time_is_counted(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="w"))
    (claimed,) = store.claim(W1, LEASE)
    store.suspend(claimed.lease, claimed.revision, "{}", wake_at=None, reason="w", signal="approve")
    assert store.get_task("w").ready_at is None
    assert _counted(store) == _truth(store) == Counter({("default", TaskState.WAITING, None): 1})


def test_batches_of_completions_made_at_once_in_opposite_orders_all_commit(backend: Backend) -> None:
    """Two workers end their claim batches at the same moment, over and over, one in
    task order and one in reverse: the counters never make one wait for the other's rows
    in an order that deadlocks (a deadlock is a store error that stalls the worker), and
    every end is counted."""
    stores = [backend.open(), backend.open()]
    stores[0].enqueue_many(
        [WorkflowTask.new("orders", 1, {"n": n}, checkpoint_id=f"t{n:03}") for n in range(240)]
    )
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def work(store: WorkflowStore, reverse: bool) -> None:
        for _ in range(6):
            claimed = store.claim(W1, LEASE, limit=20)
            claimed.sort(key=lambda c: c.lease.task_id, reverse=reverse)
            ends = [Completion(c.lease, c.revision, to_json({}), to_json(None)) for c in claimed]
            barrier.wait(timeout=30)
            try:
                store.complete_batch(ends)
            except BaseException as error:  # noqa: BLE001 - reported below
                errors.append(error)

    threads = [threading.Thread(target=work, args=(store, n == 1)) for n, store in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    done = sum(s.count for s in stores[0].queue_stats() if s.state is TaskState.TERMINAL)
    assert done == 240 and _counted(stores[0]) == _truth(stores[0])
    for store in stores:
        store.close()
    # The counters of the sessions that ended are folded (once the server has seen them
    # end; PgBouncer keeps its server sessions); the counts stay what they were.
    reader = backend.open()
    deadline = time.monotonic() + 10
    while backend.name == "postgres" and (
        backend.query("SELECT DISTINCT shard FROM runifold_finished_counts") != [(0,)]
    ):
        assert time.monotonic() < deadline, backend.query("SELECT shard, count FROM runifold_finished_counts")
        assert _counted(reader) == _truth(reader)
        time.sleep(0.1)
    assert _counted(reader) == _truth(reader)
