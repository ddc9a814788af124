"""The worker registry in the store contract, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import WorkerId, WorkflowStore
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

W1 = WorkerId.parse("host-a-0")
W2 = WorkerId.parse("host-b-0")


def test_a_registered_worker_is_listed_with_host_pid_and_versions(store: WorkflowStore) -> None:
    store.register_worker(W1, host="host-a", pid=101, definitions=[("orders", 1), ("orders", 2)])
    (record,) = store.workers()
    assert (record.worker_id, record.host, record.pid) == ("host-a-0", "host-a", 101)
    assert record.definitions == [("orders", 1), ("orders", 2)]
    assert record.stopped_at is None and record.live(timedelta(seconds=30))
    assert record.started_at == record.last_seen


def test_last_seen_moves_with_store_time_and_silence_makes_a_worker_not_live(store: WorkflowStore) -> None:
    store.register_worker(W1, host="host-a", pid=101, definitions=[])
    store.register_worker(W2, host="host-b", pid=202, definitions=[])
    store.set_clock_offset(timedelta(minutes=5))
    store.worker_seen(W1, 101)
    store.worker_seen(W2, 999)  # another process reusing the id does not refresh it
    live = {w.worker_id: w.live(timedelta(seconds=30)) for w in store.workers()}
    assert live == {"host-a-0": True, "host-b-0": False}


def test_a_stopped_worker_is_not_live_and_re_registering_revives_it(store: WorkflowStore) -> None:
    store.register_worker(W1, host="host-a", pid=101, definitions=[("orders", 1)])
    store.worker_stopped(W1, 101)
    (record,) = store.workers()
    assert record.stopped_at is not None and not record.live(timedelta(hours=1))
    store.register_worker(W1, host="host-a", pid=303, definitions=[("orders", 3)])
    (record,) = store.workers()
    assert (record.pid, record.stopped_at, record.definitions) == (303, None, [("orders", 3)])
