"""What completing one-step tasks in batches would save on PostgreSQL, before anyone
builds it: ten completions in one fenced statement (the leases unnested, the history
events written by a CTE, as the store's ``complete`` writes one) against the store's own
statement for one completion, on tasks claimed beforehand, in interleaved rounds.

The batch statement lives only here; nothing in the package sends it. The table is
ANALYZEd after the tasks are enqueued: with statistics from before them
(``--stale-statistics``) the planner joined the batch to a scan of the whole task table.

``python benchmarks/completion_batch.py [--quick] [--stale-statistics]``
"""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
from common import Row, arg_parser, enqueue_workflows, fresh_store, print_table, progress, server_cpu_s
from task_cost import Cost, spent_since

from runifold_sync import LeaseDuration, WorkerId, open_store
from runifold_sync.store.dialect import FencedTransition
from runifold_sync.store.pgstatements import NOW, Q, fenced_statement, transition_params
from runifold_sync.store.records import ClaimedTask

BATCH = 10
HEAD = '{"phase": "completed"}'
BATCH_COMPLETE = f"""
WITH clock AS (SELECT {NOW} AS now),
batch AS (
    SELECT * FROM unnest(%(ids)s::text[], %(tokens)s::bigint[], %(revisions)s::int[])
        AS b (task_id, token, revision)
),
fenced AS (
    UPDATE runifold_tasks AS t
    SET state = 'terminal', outcome = 'completed', head = %(head)s::jsonb,
        revision = t.revision + 1, result = %(result)s::jsonb, ready_at = NULL,
        lease_expires = NULL, reason = NULL, updated_at = clock.now
    FROM clock, batch AS b
    WHERE t.task_id = b.task_id AND t.fencing_token = b.token AND t.state = 'leased'
        AND t.lease_expires > clock.now AND t.revision = b.revision AND t.cancel_requested IS NULL
    RETURNING clock.now AS at, t.task_id, t.fencing_token, t.worker_id,
        CASE WHEN t.result_awaited THEN pg_notify('runifold_results', t.task_id) END AS finished
),
event AS (
    INSERT INTO runifold_events (task_id, at, kind, worker_id, fencing_token, detail)
    SELECT task_id, at, 'completed', worker_id, fencing_token, '{{}}'::jsonb FROM fenced
)
SELECT task_id FROM fenced
"""


def _one_at_a_time(conn: psycopg.Connection, tasks: list[ClaimedTask]) -> int:
    query = Q[fenced_statement("complete", event=True)]
    done = 0
    for task in tasks:
        params = {"revision": task.revision, "head": HEAD, "result": "1"}
        done += conn.execute(
            query, transition_params(FencedTransition("complete", task.lease, params, "completed"))
        ).rowcount
    return done


def _one_transaction(conn: psycopg.Connection, tasks: list[ClaimedTask]) -> int:
    """The store's own statement for each of ten tasks, pipelined in one transaction."""
    query = Q[fenced_statement("complete", event=True)]
    done = 0
    for start in range(0, len(tasks), BATCH):
        with conn.pipeline():
            conn.execute("BEGIN")
            cursors = [
                conn.execute(
                    query,
                    transition_params(
                        FencedTransition(
                            "complete",
                            t.lease,
                            {"revision": t.revision, "head": HEAD, "result": "1"},
                            "completed",
                        )
                    ),
                )
                for t in tasks[start : start + BATCH]
            ]
            conn.execute("COMMIT")
        done += sum(c.rowcount for c in cursors)
    return done


def _in_batches(conn: psycopg.Connection, tasks: list[ClaimedTask]) -> int:
    done = 0
    for start in range(0, len(tasks), BATCH):
        batch = tasks[start : start + BATCH]
        params = {
            "ids": [t.lease.task_id for t in batch],
            "tokens": [t.lease.fencing_token for t in batch],
            "revisions": [t.revision for t in batch],
            "head": HEAD,
            "result": "1",
        }
        done += len(conn.execute(BATCH_COMPLETE, params).fetchall())
    return done


def run(quick: bool, *, analyze: bool = True) -> list[Row]:
    per_round, rounds = (500, 2) if quick else (1000, 4)
    spent = {
        "one": Cost(0.0, 0.0),
        "transaction": Cost(0.0, 0.0),
        "batch": Cost(0.0, 0.0),
    }  # per task, summed over rounds
    with fresh_store("postgres") as url:
        store = open_store(url)
        try:
            enqueue_workflows(store, per_round * rounds * 3, 1, delay=None)
            claimed: list[ClaimedTask] = []
            while got := store.claim(
                WorkerId.parse("batch-0"), LeaseDuration(timedelta(minutes=30)), limit=500
            ):
                claimed += got
        finally:
            store.close()
        with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
            if analyze:
                conn.execute("ANALYZE runifold_tasks")
            for round_ in range(rounds):
                progress(f"completion batch: round {round_ + 1} of {rounds}")
                for name, complete in (
                    ("one", _one_at_a_time),
                    ("transaction", _one_transaction),
                    ("batch", _in_batches),
                ):
                    tasks, claimed = claimed[:per_round], claimed[per_round:]
                    cpu0, server0 = time.process_time(), server_cpu_s()
                    if complete(conn, tasks) != len(tasks):
                        raise RuntimeError(f"{name}: not every completion matched its lease")
                    spent[name] = spent[name].plus(spent_since(len(tasks), cpu0, server0))
    one, batch = spent["one"].divided(rounds), spent["batch"].divided(rounds)
    together = spent["transaction"].divided(rounds)

    def value(cost: Cost) -> str:
        return f"{cost.total_us:,.0f} µs ({cost.client_us:,.0f} client + {cost.server_us:,.0f} server)"

    def against_one(cost: Cost) -> str:
        return (
            f"{cost.total_us / one.total_us:.2f}x (client {cost.client_us / one.client_us:.2f}x, "
            f"server {cost.server_us / one.server_us:.2f}x); "
            f"saves {one.total_us - cost.total_us:,.0f} µs a task"
        )

    return [
        Row("one completion a statement (the store's): per task", value(one), "baseline"),
        Row(
            f"the store's statement for {BATCH} tasks in one transaction: per task",
            value(together),
            against_one(together),
        ),
        Row(
            f"{BATCH} completions a statement: per task",
            value(batch),
            against_one(batch),
        ),
    ]


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--stale-statistics", action="store_true", help="skip the ANALYZE after the enqueue (the bad plan)"
    )
    args = parser.parse_args()
    rows = run(args.quick, analyze=not args.stale_statistics)
    print_table("completions in batches (PostgreSQL, what-if)", rows)


if __name__ == "__main__":
    main()
