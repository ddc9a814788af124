"""What completing one-step tasks in batches saves on PostgreSQL: ``store.complete`` of
each task against ``store.complete_batch`` of ten (one statement, as a worker's loop
commits a claim batch's held completions) and against the alternative it replaced, the
store's own completion statement for each of ten tasks pipelined in one transaction, on
tasks claimed beforehand, in interleaved rounds.

The table is ANALYZEd after the tasks are enqueued; with statistics from before them
(``--stale-statistics``) the batch statement must still find its rows by primary key (a
first version, joined to its batch only, scanned the whole task table there: 792 µs a
task against 56-63 analyzed).

``python benchmarks/completion_batch.py [--quick] [--stale-statistics]``
"""

from __future__ import annotations

import time
from datetime import timedelta

import psycopg
from common import Row, arg_parser, enqueue_workflows, fresh_store, print_table, progress, server_cpu_s
from task_cost import Cost, spent_since

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, open_store
from runifold_sync.store.dialect import FencedTransition
from runifold_sync.store.postgres.statements import Q, fenced_statement, transition_params
from runifold_sync.store.records import ClaimedTask, Completion

BATCH = 10
HEAD = '{"phase": "completed"}'


def _one_at_a_time(store: WorkflowStore, conn: psycopg.Connection, tasks: list[ClaimedTask]) -> int:
    for task in tasks:
        store.complete(task.lease, task.revision, HEAD, "1")
    return len(tasks)


def _one_transaction(store: WorkflowStore, conn: psycopg.Connection, tasks: list[ClaimedTask]) -> int:
    """The store's statement for each of ten tasks, pipelined in one transaction."""
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


def _in_batches(store: WorkflowStore, conn: psycopg.Connection, tasks: list[ClaimedTask]) -> int:
    done = 0
    for start in range(0, len(tasks), BATCH):
        batch = tasks[start : start + BATCH]
        result = store.complete_batch([Completion(t.lease, t.revision, HEAD, "1") for t in batch])
        done += len(batch) - len(result.refused)
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
                        if complete(store, conn, tasks) != len(tasks):
                            raise RuntimeError(f"{name}: not every completion matched its lease")
                        spent[name] = spent[name].plus(spent_since(len(tasks), cpu0, server0))
        finally:
            store.close()
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
        Row("store.complete, one task a transaction: per task", value(one), "baseline"),
        Row(
            f"complete's statement for each of {BATCH} tasks, one transaction: per task",
            value(together),
            against_one(together),
        ),
        Row(
            f"store.complete_batch of {BATCH} tasks (one statement): per task",
            value(batch),
            against_one(batch),
        ),
    ]


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--stale-statistics", action="store_true", help="skip the ANALYZE after the enqueue")
    args = parser.parse_args()
    rows = run(args.quick, analyze=not args.stale_statistics)
    print_table("completions in batches (PostgreSQL)", rows)


if __name__ == "__main__":
    main()
