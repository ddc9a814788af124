"""``enqueue_many`` writes a batch's tasks without flow options together (one statement on
PostgreSQL, see ``insert_tasks_bulk``), on every backend: each task is stored as a
one-by-one enqueue stores it, with its one ``enqueued`` event; an id stored already is
answered as before (the stored task, or a conflict that rolls the whole batch back); a
task with flow options in the batch is applied in its place in the batch's order; and
in the application's transaction (``connection=``) the batch exists only if it commits."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import EnqueueConflict, TaskNotFound
from runifold_sync.store import TaskState
from tests.store.test_enqueue_in_transaction import app_connection
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

W1 = WorkerId.parse("worker-1")
LEASE = LeaseDuration(timedelta(seconds=30))


def _plain(n: int, **options: object) -> WorkflowTask:
    return WorkflowTask.new("orders", 1, {"n": n}, checkpoint_id=f"t{n:03}", **options)  # type: ignore[arg-type]


def test_a_batch_of_128_is_stored_task_by_task_as_one_enqueue_stores_each(store: WorkflowStore) -> None:
    batch = [_plain(n, priority=n % 3, tenant="acme" if n % 2 else "globex") for n in range(128)]
    batch[5] = _plain(5, queue="mail", concurrency_key="customer-5")
    results = store.enqueue_many(batch)
    assert [(r.task_id, r.created) for r in results] == [(t.task_id, True) for t in batch]
    for task in (batch[0], batch[5], batch[127]):
        record = store.get_task(task.task_id)
        assert (record.state, record.input_json, record.priority, record.tenant) == (
            TaskState.QUEUED,
            task.input_json,
            task.priority,
            task.tenant,
        )
        assert (record.queue, record.concurrency_key) == (task.queue, task.concurrency_key)
        assert record.ready_at is not None and record.ready_at == record.created_at
        (event,) = store.history(task.task_id)
        assert event.kind == "enqueued"
    assert store.history("t005")[0].detail == {"definition": "orders", "version": 1, "queue": "mail"}
    assert len(store.list_tasks(limit=500)) == 128
    # The tasks are claimed as those of one-by-one enqueues are: highest priority first.
    (claimed,) = store.claim(W1, LEASE)
    assert store.get_task(claimed.lease.task_id).priority == 2


def test_a_batch_keeps_not_before_in_the_future_and_moves_a_past_one_to_now(store: WorkflowStore) -> None:
    now = store.now()
    later = _plain(1, not_before=now + timedelta(hours=1))
    earlier = _plain(2, not_before=now - timedelta(hours=1))
    store.enqueue_many([later, _plain(3), earlier])
    assert store.get_task("t001").ready_at == now + timedelta(hours=1)
    record = store.get_task("t002")
    assert record.ready_at == record.created_at


def test_a_batch_with_stored_ids_answers_each_and_creates_only_the_new(store: WorkflowStore) -> None:
    store.enqueue_many([_plain(n) for n in range(4)])
    results = store.enqueue_many([_plain(n) for n in range(2, 7)])
    assert [(r.task_id, r.created) for r in results] == [
        ("t002", False),
        ("t003", False),
        ("t004", True),
        ("t005", True),
        ("t006", True),
    ]
    assert [len(store.history(f"t{n:03}")) for n in range(7)] == [1] * 7


def test_a_conflicting_id_in_a_batch_rolls_the_whole_batch_back(store: WorkflowStore) -> None:
    store.enqueue(_plain(1))
    changed = WorkflowTask.new("orders", 1, {"n": "other"}, checkpoint_id="t001")
    with pytest.raises(EnqueueConflict):
        store.enqueue_many([_plain(0), changed, _plain(2)])
    assert [t.task_id for t in store.list_tasks()] == ["t001"]
    with pytest.raises(TaskNotFound):
        store.get_task("t000")


def test_flow_tasks_in_a_batch_apply_one_by_one_in_the_batch_order(store: WorkflowStore) -> None:
    window = timedelta(minutes=10)
    batch = [
        _plain(0),
        WorkflowTask.new("orders", 1, {"n": 1}, checkpoint_id="s1", dedup_key="sync", singleton=True),
        _plain(2),
        WorkflowTask.new("orders", 1, {"n": 3}, checkpoint_id="s3", dedup_key="sync", singleton=True),
        WorkflowTask.new("orders", 1, {"n": 4}, checkpoint_id="d4", debounce=window, debounce_key="doc"),
        _plain(5),
        WorkflowTask.new("orders", 1, {"n": 6}, checkpoint_id="d6", debounce=window, debounce_key="doc"),
        _plain(7),
    ]
    results = store.enqueue_many(batch)
    assert [(r.task_id, r.created) for r in results] == [
        ("t000", True),
        ("s1", True),
        ("t002", True),
        ("s1", False),  # the singleton of "sync" enqueued earlier in the same batch
        ("d4", True),
        ("t005", True),
        ("d4", False),  # folded into d4, enqueued earlier in the same batch
        ("t007", True),
    ]
    assert store.get_task("d4").input_json == batch[6].input_json
    assert {t.task_id for t in store.list_tasks()} == {"t000", "s1", "t002", "d4", "t005", "t007"}


def test_a_batch_in_a_rolled_back_transaction_does_not_exist(store: WorkflowStore, backend: Backend) -> None:
    with app_connection(backend) as conn:
        store.enqueue_many([_plain(n) for n in range(20)], connection=conn)
        conn.rollback()
    assert store.list_tasks() == []
    assert store.history("t000") == []


def test_a_batch_in_a_committed_transaction_exists_with_its_events(
    store: WorkflowStore, backend: Backend
) -> None:
    store.enqueue(_plain(3))
    with app_connection(backend) as conn:
        results = store.enqueue_many([_plain(n) for n in range(20)], connection=conn)
        with pytest.raises(TaskNotFound):  # not visible to anyone before the commit
            store.get_task("t000")
        conn.commit()
    assert [r.created for r in results] == [n != 3 for n in range(20)]
    assert len(store.list_tasks()) == 20
    assert all([e.kind for e in store.history(f"t{n:03}")] == ["enqueued"] for n in range(20))


def test_a_batch_keeps_inputs_as_written_whatever_their_characters(store: WorkflowStore) -> None:
    inputs = [{"text": 'caf\u00e9 \U0001f600 "quoted" \\ back'}, {"nested": [1, 2.5, None, True]}, "x\ny"]
    batch = [WorkflowTask.new("orders", 1, value, checkpoint_id=f"u{n}") for n, value in enumerate(inputs)]
    store.enqueue_many(batch)
    assert [store.get_task(t.task_id).input_json for t in batch] == [t.input_json for t in batch]


def test_a_batch_is_claimed_in_its_order_as_tasks_enqueued_one_by_one_are(store: WorkflowStore) -> None:
    """Tasks of one priority are served by their ready time: a batch's tasks are stamped
    apart, in the batch's order, so the claims take them first to last."""
    ids = [f"t{n:03}" for n in range(60)]
    store.enqueue_many([WorkflowTask.new("orders", 1, {"n": n}, checkpoint_id=i) for n, i in enumerate(ids)])
    stamps = [store.get_task(i).created_at for i in ids]
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)
    assert [c.lease.task_id for _ in ids for c in store.claim(W1, LEASE)] == ids
