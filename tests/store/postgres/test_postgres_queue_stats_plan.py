"""``queue_stats`` on PostgreSQL reads no finished task (EXPLAIN over a table of 50,000
tasks, 98% finished): the unfinished ones from their partial indexes, the finished ones
from their counters."""

from __future__ import annotations

import psycopg

from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store.postgres.statements import Q

from .test_postgres_dashboard_plan import _nodes


def test_queue_stats_reads_the_unfinished_indexes_only(pg: PostgresWorkflowStore, postgres_url: str) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, outcome, ready_at, created_at, updated_at) "
            "SELECT 't-' || g, 'orders', 1, 'acme', '0', '0', "
            "CASE WHEN g %% 50 = 0 THEN 'queued' ELSE 'terminal' END, "
            "CASE WHEN g %% 50 = 0 THEN NULL ELSE 'completed' END, now(), now(), now() "
            "FROM generate_series(1, %(count)s) g",
            {"count": 50_000},
        )
        admin.execute("ANALYZE")
        [(plan,)] = admin.execute(("EXPLAIN (FORMAT JSON) " + Q["queue_stats"]).encode()).fetchall()
    nodes = list(_nodes(plan[0]["Plan"]))
    assert not any(n["Node Type"] == "Seq Scan" and n["Relation Name"] == "runifold_tasks" for n in nodes), (
        nodes
    )
    indexes = {n["Index Name"] for n in nodes if n.get("Index Name", "").startswith("runifold_tasks")}
    assert indexes == {"runifold_tasks_routed", "runifold_tasks_unready"}, nodes
    counts = {(s.state.value, s.count) for s in pg.queue_stats()}
    assert counts == {("queued", 1_000), ("terminal", 49_000)}
