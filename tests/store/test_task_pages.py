"""The dashboard's reads of the store contract, on every backend: the task list paged by
keyset (creation order, a cursor of (created_at, task_id)) and the throughput of
finished tasks per interval."""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.errors import InvalidArgument
from runifold_sync.store import TaskState
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))


def _walk(store: WorkflowStore, limit: int, **filters: object) -> list[list[str]]:
    """Every page's task ids, following the cursors from the first page."""
    pages: list[list[str]] = []
    after = None
    while True:
        page = store.list_tasks_page(after=after, limit=limit, **filters)  # type: ignore[arg-type]
        pages.append([t.task_id for t in page.tasks])
        if page.next_after is None:
            return pages
        after = page.next_after


def test_paging_visits_every_task_once_in_creation_order(store: WorkflowStore) -> None:
    # Batches enqueued in one transaction share their creation time: the task id orders
    # them, and a page boundary inside a batch must neither skip nor repeat one.
    store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"b1-{n:02}") for n in range(11)])
    store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"a2-{n:02}") for n in range(6)])
    expected = [t.task_id for t in store.list_tasks(limit=100)]
    assert len(expected) == 17
    for limit in (1, 4, 5, 17, 50):
        pages = _walk(store, limit)
        assert [task for page in pages for task in page] == expected, limit
        assert all(len(page) == limit for page in pages[:-1])
        assert 0 < len(pages[-1]) <= limit


def test_a_task_enqueued_during_a_walk_comes_on_a_later_page_and_nothing_repeats(
    store: WorkflowStore,
) -> None:
    store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"t{n}") for n in range(4)])
    first = store.list_tasks_page(limit=2)
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="late"))
    rest = _walk_from(store, first.next_after)
    assert [t.task_id for t in first.tasks] + rest == ["t0", "t1", "t2", "t3", "late"]


def _walk_from(store: WorkflowStore, after: str | None) -> list[str]:
    found: list[str] = []
    while after is not None:
        page = store.list_tasks_page(after=after, limit=2)
        found += [t.task_id for t in page.tasks]
        after = page.next_after
    return found


def test_paging_applies_every_filter(store: WorkflowStore) -> None:
    tasks = [
        WorkflowTask.new(
            "orders" if n % 2 else "invoices", 1, n, checkpoint_id=f"t{n:02}", tenant=f"c{n % 3}"
        )
        for n in range(12)
    ]
    store.enqueue_many(tasks)
    store.enqueue(WorkflowTask.new("render", 1, None, checkpoint_id="r", queue="render"))
    store.claim(WorkerId.parse("w"), LEASE)  # leases t00, the oldest
    for filters in (
        {"state": TaskState.QUEUED},
        {"tenant": "c1"},
        {"definition": "orders"},
        {"queue": "render"},
        {"state": TaskState.QUEUED, "tenant": "c0", "definition": "invoices"},
    ):
        expected = [t.task_id for t in store.list_tasks(limit=100, **filters)]  # type: ignore[arg-type]
        assert [task for page in _walk(store, 2, **filters) for task in page] == expected, filters
    assert _walk(store, 3, tenant="nobody") == [[]]


def test_paging_lists_a_tasks_children(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="parent"))
    assert _walk(store, 5, parent="parent") == [[]]
    assert store.list_tasks_page().tasks[0].task_id == "parent"


@pytest.mark.parametrize("cursor", ["", "no bar", "not a time|t1", "2026-01-01T00:00:00|t1", 7])
def test_a_cursor_no_page_returned_is_refused(store: WorkflowStore, cursor: object) -> None:
    with pytest.raises(InvalidArgument, match="task page cursor must be a cursor a page returned"):
        store.list_tasks_page(after=cursor)  # type: ignore[arg-type]


def test_throughput_counts_the_tasks_finished_in_each_interval(store: WorkflowStore) -> None:
    store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"t{n}") for n in range(4)])
    worker = WorkerId.parse("w")
    for claimed in store.claim(worker, LEASE, limit=2):
        store.complete(claimed.lease, claimed.revision, None, "1")
    (failing,) = store.claim(worker, LEASE)
    store.fail(failing.lease, failing.revision, None, reason="boom")
    store.cancel("t3", "ops", "not needed")
    intervals = store.finished_per_interval(timedelta(hours=1), 12)
    assert len(intervals) == 12
    assert [i.start for i in intervals] == sorted(i.start for i in intervals)
    assert store.now() - timedelta(minutes=5, seconds=10) <= intervals[-1].start <= store.now()
    assert (intervals[-1].completed, intervals[-1].failed, intervals[-1].cancelled) == (2, 1, 1)
    assert sum(i.total for i in intervals[:-1]) == 0


def test_throughput_refuses_a_bad_span_or_count(store: WorkflowStore) -> None:
    with pytest.raises(
        InvalidArgument, match=r"throughput span must be positive, got datetime.timedelta\(0\)"
    ):
        store.finished_per_interval(timedelta(0), 12)
    with pytest.raises(InvalidArgument, match="throughput intervals"):
        store.finished_per_interval(timedelta(hours=1), 0)


def test_a_page_looks_through_at_most_scan_tasks_and_goes_on_after_them(store: WorkflowStore) -> None:
    store.enqueue_many(
        [
            WorkflowTask.new("rare" if n in (3, 17) else "common", 1, n, checkpoint_id=f"t{n:02}")
            for n in range(20)
        ]
    )
    pages: list[list[str]] = []
    after = None
    while True:
        page = store.list_tasks_page(definition="rare", after=after, limit=2, scan=5)
        pages.append([t.task_id for t in page.tasks])
        if page.next_after is None:
            break
        after = page.next_after
    # Windows of 5 tasks: t00-t04 holds t03, then nothing until t15-t19 holds t17.
    assert pages == [["t03"], [], [], ["t17"]]
    with pytest.raises(InvalidArgument, match="page scan must be an integer in 2.."):
        store.list_tasks_page(limit=2, scan=1)


def test_newest_first_pages_walk_the_same_tasks_backwards(store: WorkflowStore) -> None:
    store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"b1-{n:02}") for n in range(9)])
    store.enqueue_many(
        [
            WorkflowTask.new("invoices" if n % 2 else "orders", 1, n, checkpoint_id=f"a2-{n:02}")
            for n in range(8)
        ]
    )
    oldest_first = [t.task_id for t in store.list_tasks(limit=100)]
    for limit, filters in ((1, {}), (4, {}), (3, {"definition": "orders"})):
        expected = [t.task_id for t in store.list_tasks(limit=100, **filters)][::-1]  # type: ignore[arg-type]
        found = []
        after = None
        while True:
            page = store.list_tasks_page(after=after, limit=limit, newest_first=True, scan=5, **filters)  # type: ignore[arg-type]
            found += [t.task_id for t in page.tasks]
            if page.next_after is None:
                break
            after = page.next_after
        assert found == expected, (limit, filters)
    assert [t.task_id for t in store.list_tasks_page(limit=3, newest_first=True).tasks] == oldest_first[
        :-4:-1
    ]
    with pytest.raises(InvalidArgument, match="newest_first must be True or False"):
        store.list_tasks_page(newest_first="yes")  # type: ignore[arg-type]


def test_an_unknown_filter_is_a_type_error_naming_it(store: WorkflowStore) -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'tenants'"):
        store.list_tasks_page(tenants="acme")  # type: ignore[call-arg]
