"""The plan of query ``complete_batch`` (a claim batch's held completions, one statement)
as a worker runs it: prepared on a store connection, on its generic plan, beside many
leased tasks on statistics from before they were leased. It must find its rows by
primary key; the partial index of leased tasks (which the fence's ``state = 'leased'``
could use) would read every lease in flight for each batch, and a join to the parents a
scan of the whole table."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from psycopg import sql

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store.dialect import FencedTransition
from runifold_sync.store.postgres.statements import Q, batch_params
from tests.support.pgplans import numbered, plan_nodes

LEASED = 3000
LEASE = LeaseDuration(timedelta(minutes=5))


def test_the_batch_completion_finds_its_rows_by_primary_key_beside_thousands_of_leases(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("ANALYZE runifold_tasks")  # statistics of an empty table
    pg.enqueue_many([WorkflowTask.new("orders", 1, n, checkpoint_id=f"t{n}") for n in range(LEASED)])
    claimed = []
    while got := pg.claim(WorkerId.parse("worker-1"), LEASE, limit=100):
        claimed += got
    assert len(claimed) == LEASED
    batch = [
        FencedTransition(
            "complete", c.lease, {"revision": c.revision, "head": "{}", "result": "1"}, "completed"
        )
        for c in claimed[:10]
    ]
    text, names = numbered(Q["complete_batch"])
    params = batch_params(batch)
    arguments = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
    with pg.dialect.pool.connection() as conn, conn.transaction():
        conn.execute(Q["use_generic_plans"])  # as complete_all runs it
        conn.execute(("PREPARE runifold_batch AS " + text).encode())
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE runifold_batch ({})")
        [plan] = conn.execute(explain.format(arguments)).fetchall()
        conn.execute("DEALLOCATE runifold_batch")  # prepared statements outlive a rollback
        raise psycopg.Rollback()  # EXPLAIN ANALYZE ran the UPDATE
    nodes = list(plan_nodes(plan["QUERY PLAN"][0]["Plan"]))
    on_tasks = [n for n in nodes if n.get("Index Name", "").startswith("runifold_tasks")]
    on_tasks += [n for n in nodes if n.get("Relation Name") == "runifold_tasks" and "Index Name" not in n]
    assert {n["Node Type"] for n in on_tasks} <= {
        "Index Scan",
        "Bitmap Index Scan",
        "Bitmap Heap Scan",
        "ModifyTable",
    }
    assert {n.get("Index Name") for n in on_tasks} - {None} <= {
        "runifold_tasks_pkey",
        "runifold_tasks_created",
    }
    # Ten rows, and the index entries of their older versions (each claim wrote one):
    # nowhere near the 3,000 leases a scan of the leased tasks (or of all) would read.
    assert all(n["Actual Rows"] <= 50 for n in on_tasks), [
        (n["Node Type"], n["Actual Rows"]) for n in on_tasks
    ]
