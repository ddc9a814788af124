"""``queue_stats`` on SQLite reads no finished task (EXPLAIN QUERY PLAN): the unfinished
ones from their partial indexes, the finished ones from their counters."""

from __future__ import annotations

from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.sqlite.store import _Q


def test_queue_stats_searches_the_unfinished_indexes_only(sqlite_store: SqliteWorkflowStore) -> None:
    conn = sqlite_store.dialect._conn().raw
    with conn:
        conn.execute(
            "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 5000) "
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "state, outcome, ready_at, created_at, updated_at) "
            "SELECT 't-' || n, 'orders', 1, 'acme', '0', "
            "CASE WHEN n % 50 = 0 THEN 'queued' ELSE 'terminal' END, "
            "CASE WHEN n % 50 = 0 THEN NULL ELSE 'completed' END, n, n, n FROM g"
        )
        conn.execute("ANALYZE")
    lines = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + _Q["queue_stats"])]
    # Each read of the table walks one of the partial indexes that hold unfinished tasks only.
    reads = [line for line in lines if line.startswith(("SCAN runifold_tasks", "SEARCH runifold_tasks"))]
    assert len(reads) == 2, lines
    assert "USING INDEX runifold_tasks_routed" in reads[0], lines
    assert "USING INDEX runifold_tasks_unready" in reads[1], lines
    counts = {(s.state.value, s.count) for s in sqlite_store.queue_stats()}
    assert counts == {("queued", 100), ("terminal", 4900)}
