"""The dashboard's SQLite reads use their indexes (EXPLAIN QUERY PLAN): a task page reads
its window from runifold_tasks_created from its cursor, never the table, and the throughput reads only the
recent ending events of runifold_events_ended."""

from __future__ import annotations

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.sqlite.store import _Q

PAGE = {
    "state": None,
    "tenant": None,
    "definition": None,
    "parent": None,
    "queue": None,
    "attributes": "[]",
    "attribute_count": 0,
}


def plan(store: SqliteWorkflowStore, name: str, params: dict[str, object]) -> list[str]:
    conn = store.dialect._conn().raw
    return [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + _Q[name], params)]


def test_a_task_page_searches_the_creation_index_from_its_cursor(sqlite_store: SqliteWorkflowStore) -> None:
    sqlite_store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"t{n}") for n in range(2000)])
    sqlite_store.dialect._conn().raw.execute("ANALYZE")
    for filters in (PAGE, PAGE | {"state": "queued", "tenant": "acme"}):
        lines = plan(
            sqlite_store,
            "list_tasks_page",
            filters | {"after_at": 5, "after_id": "t9", "limit": 51, "scan": 10_000},
        )
        assert any(
            line.startswith("SEARCH runifold_tasks USING INDEX runifold_tasks_created") for line in lines
        ), lines
        # The window (at most :scan rows) is read in index order; only its matches are
        # ordered again, a top-:limit sort of rows already read. No scan of the table.
        assert not any(line.startswith("SCAN runifold_tasks") for line in lines), lines
        assert lines.index("SCAN w") > lines.index("CO-ROUTINE w"), lines


def test_newest_first_pages_search_the_creation_index_backwards(sqlite_store: SqliteWorkflowStore) -> None:
    sqlite_store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"t{n}") for n in range(2000)])
    sqlite_store.dialect._conn().raw.execute("ANALYZE")
    window = {"after_at": 5, "after_id": "t9", "scan": 10_000}
    lines = plan(sqlite_store, "list_tasks_page_newest", PAGE | window | {"limit": 51})
    assert "SEARCH runifold_tasks USING INDEX runifold_tasks_created ((created_at,task_id)<(?,?))" in lines
    assert not any(line.startswith("SCAN runifold_tasks") for line in lines), lines


@pytest.mark.parametrize(("query", "way"), [("task_window_end", ">"), ("task_window_end_newest", "<")])
def test_a_pages_window_end_is_read_from_the_index_alone(
    sqlite_store: SqliteWorkflowStore, query: str, way: str
) -> None:
    lines = plan(sqlite_store, query, {"after_at": 5, "after_id": "t9", "scan": 10_000})
    assert lines == [
        f"SEARCH runifold_tasks USING COVERING INDEX runifold_tasks_created ((created_at,task_id){way}(?,?))"
    ]


def test_the_throughput_searches_the_ending_events_by_time(sqlite_store: SqliteWorkflowStore) -> None:
    lines = plan(sqlite_store, "finished_per_interval", {"since": 0, "interval": 300_000_000})
    assert any("USING INDEX runifold_events_ended (at>?)" in line for line in lines), lines
    assert not any(line.startswith("SCAN runifold_events") for line in lines), lines


def test_a_tasks_children_are_read_from_the_parent_index(sqlite_store: SqliteWorkflowStore) -> None:
    """The task page (and ``show``) lists a task's children: from runifold_tasks_parent,
    not by reading every task (the filters' ``:parent IS NULL OR`` form alone does)."""
    sqlite_store.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"t{n}") for n in range(2000)])
    sqlite_store.dialect._conn().raw.execute("ANALYZE")
    lines = plan(sqlite_store, "list_children", PAGE | {"parent": "t7", "limit": 100})
    assert any(line.startswith("SEARCH runifold_tasks USING INDEX runifold_tasks_parent") for line in lines)
    assert not any(line.startswith("SCAN runifold_tasks") for line in lines), lines
    assert [t.task_id for t in sqlite_store.list_tasks(parent="t7")] == []


def test_an_attribute_filter_reads_the_attribute_index(sqlite_store: SqliteWorkflowStore) -> None:
    """``list_tasks(attributes=...)``: the matching tasks are found from
    runifold_task_attributes_value (key, kind, value), not by reading every attribute."""
    filters = PAGE | {
        "attributes": '[{"key": "customer", "kind": "text", "value": "c-42"}]',
        "attribute_count": 1,
    }
    lines = plan(sqlite_store, "list_tasks", filters | {"limit": 100})
    assert any("USING COVERING INDEX runifold_task_attributes_value" in line for line in lines), lines
    assert not any(line.startswith("SCAN runifold_task_attributes") for line in lines), lines
