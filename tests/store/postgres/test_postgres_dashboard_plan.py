"""The dashboard's PostgreSQL reads use their indexes (EXPLAIN) over a large table: a task
page is an index scan of runifold_tasks_created from its cursor with no sort, and the
throughput reads runifold_events_ended for the last hour only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store.postgres.statements import Q

PAGE: dict[str, Any] = {
    "state": None,
    "tenant": None,
    "definition": None,
    "parent": None,
    "queue": None,
    "attributes": "[]",
    "attribute_count": 0,
}


def _seed(url: str, count: int) -> None:
    """``count`` tasks created over the last 60 days, a tenth of them finished, with an
    event for each enqueue and each end."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, outcome, ready_at, created_at, updated_at) "
            "SELECT 't-' || g, 'orders', 1, 'acme', '0', '0', "
            "CASE WHEN g %% 10 = 0 THEN 'terminal' ELSE 'queued' END, "
            "CASE WHEN g %% 10 = 0 THEN 'completed' END, now(), "
            "now() - interval '60 days' + g * interval '100 ms', "
            "now() - interval '60 days' + g * interval '100 ms' "
            "FROM generate_series(1, %(count)s) g",
            {"count": count},
        )
        admin.execute(
            "INSERT INTO runifold_events (task_id, at, kind) "
            "SELECT task_id, created_at, 'enqueued' FROM runifold_tasks UNION ALL "
            "SELECT task_id, updated_at, 'completed' FROM runifold_tasks WHERE state = 'terminal'"
        )
        admin.execute("ANALYZE")


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _explain(url: str, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn:
        [(plan,)] = conn.execute(("EXPLAIN (FORMAT JSON) " + Q[name]).encode(), params).fetchall()
    return list(_nodes(plan[0]["Plan"]))


def test_a_task_page_scans_the_creation_index_from_its_cursor(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    _seed(postgres_url, 50_000)
    after = {
        "after_at": datetime.now(UTC) - timedelta(days=30),
        "after_id": "t-1",
        "limit": 51,
        "scan": 10_000,
    }
    for query, filters in (
        ("list_tasks_page", PAGE),
        ("list_tasks_page", PAGE | {"state": "queued", "tenant": "acme"}),
        ("list_tasks_page_newest", PAGE),
    ):
        nodes = _explain(postgres_url, query, filters | after)
        assert {n.get("Index Name") for n in nodes} - {None} == {"runifold_tasks_created"}, nodes
        assert not any(n["Node Type"] in ("Seq Scan", "Sort") for n in nodes), nodes
    window = {k: after[k] for k in ("after_at", "after_id", "scan")}
    for query in ("task_window_end", "task_window_end_newest"):
        nodes = _explain(postgres_url, query, window)
        assert [n.get("Index Name") for n in nodes if "Index Name" in n] == ["runifold_tasks_created"], nodes
        assert any(n["Node Type"] == "Index Only Scan" for n in nodes), nodes


def test_the_throughput_reads_the_last_hours_ending_events_by_index(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    _seed(postgres_url, 50_000)
    params = {"since": datetime.now(UTC) - timedelta(hours=1), "interval": 300.0}
    nodes = _explain(postgres_url, "finished_per_interval", params)
    assert {n.get("Index Name") for n in nodes} - {None} == {"runifold_events_ended"}, nodes
    assert not any(n["Node Type"] == "Seq Scan" for n in nodes), nodes
