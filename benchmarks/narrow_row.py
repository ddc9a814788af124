"""What a narrow run-state row could save a step, measured before building one (issue 50,
item 2): the least write a step makes, a finished 5-step workflow's head written to its
task row (autocommit, unfenced, in turn with another workflow's head), to today's wide
``runifold_tasks`` row and to a narrow table holding only what changes at every claim,
heartbeat and commit (state, owner, fencing token, lease expiry, revision, the head as
text) under its primary key alone, beside a raw single-row UPDATE commit. Variants run in
interleaved rounds of one second each (the best round of each counts); PostgreSQL is
compared by the whole machine's CPU per commit (this client and the server), SQLite by
wall time (its commit waits for the disk). The narrow row's ratio to the wide one bounds
what moving the hot columns apart can gain a step's write; the engine's other work per
step is not touched by it.

``python benchmarks/narrow_row.py [--quick]``.
"""

from __future__ import annotations

import sqlite3

import psycopg
from commit_limit import CommitLoop, Write, measure_commit_loop, measure_write_loop
from common import Row, arg_parser, fresh_store, print_table, progress, server_cpu_s
from cpu_per_step import measure_worker

from runifold_sync import open_store
from runifold_sync.store import TaskState
from runifold_sync.store.open import sqlite_path

NARROW_TABLE = """CREATE TABLE bench_task_runs AS
    SELECT task_id, state, worker_id, fencing_token, lease_expires, revision, {head} AS head
    FROM runifold_tasks"""


def _writes(url: str) -> dict[str, Write]:
    """The wide and narrow head writes on the store at ``url``, whose finished workflows
    give the heads; the narrow table is made here, a copy of the run-state columns."""
    with open_store(url) as store:
        tasks = store.list_tasks(state=TaskState.TERMINAL, limit=2)
        heads = [store.get_task(task.task_id).checkpoint_json for task in tasks]
    task_id = tasks[0].task_id
    params = tuple((head, task_id) for head in heads)
    if url.startswith("postgresql"):
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(NARROW_TABLE.format(head="head::text"))
            conn.execute("ALTER TABLE bench_task_runs ADD PRIMARY KEY (task_id)")
    else:
        conn = sqlite3.connect(sqlite_path(url), isolation_level=None)
        try:
            conn.execute(NARROW_TABLE.format(head="head"))
            conn.execute("CREATE UNIQUE INDEX bench_task_runs_key ON bench_task_runs (task_id)")
        finally:
            conn.close()
    return {
        "wide": Write(
            "UPDATE runifold_tasks SET head = ? WHERE task_id = ?",
            "UPDATE runifold_tasks SET head = %s::jsonb WHERE task_id = %s",
            params,
        ),
        "narrow": Write(
            "UPDATE bench_task_runs SET head = ? WHERE task_id = ?",
            "UPDATE bench_task_runs SET head = %s WHERE task_id = %s",
            params,
        ),
    }


def _per_commit(kind: str, loop: CommitLoop, server_s: float | None) -> float:
    """µs per commit: whole-machine CPU on PostgreSQL, wall time on SQLite."""
    if kind == "postgres":
        assert server_s is not None, "the PostgreSQL server's CPU is read from /proc: a local server"
        return (loop.cpu_s + server_s) / loop.commits * 1e6
    return loop.wall_s / loop.commits * 1e6


def measure(kind: str, rounds: int) -> dict[str, float]:
    best: dict[str, float] = {}
    with fresh_store(kind) as url:
        measure_worker(url, workflows=20, steps=5)
        writes = _writes(url)
        measure_commit_loop(url, duration_s=0.2)  # makes the raw commit's table
        for _ in range(rounds):
            for name in ("raw", "wide", "narrow"):
                before = server_cpu_s() if kind == "postgres" else None
                if name == "raw":
                    loop = measure_commit_loop(url, duration_s=1.0, prepare=False)
                else:
                    loop = measure_write_loop(url, writes[name], duration_s=1.0)
                after = server_cpu_s() if kind == "postgres" else None
                spent = None if before is None or after is None else after - before
                value = _per_commit(kind, loop, spent)
                best[name] = min(best.get(name, value), value)
    return best


def run(quick: bool) -> list[Row]:
    rounds = 2 if quick else 5
    rows = []
    for kind, label, unit in (
        ("postgres", "PostgreSQL", "whole-machine CPU"),
        ("sqlite", "SQLite FULL", "wall time"),
    ):
        progress(f"narrow row: {label}, {rounds} rounds")
        best = measure(kind, rounds)
        raw, wide, narrow = best["raw"], best["wide"], best["narrow"]
        rows.append(Row(f"{label}: {unit} of a raw single-row UPDATE commit", f"{raw:,.0f} µs", "baseline"))
        rows.append(
            Row(
                f"{label}: {unit} of a step's head written to the wide task row",
                f"{wide:,.0f} µs",
                f"{wide / raw:.2f}x raw",
            )
        )
        rows.append(
            Row(
                f"{label}: {unit} of the same head written to a narrow run-state row",
                f"{narrow:,.0f} µs",
                f"{narrow / raw:.2f}x raw, {narrow / wide:.2f}x the wide row",
            )
        )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="2 rounds instead of 5")
    args = parser.parse_args()
    print_table("A step's least write: the wide task row against a narrow run-state row", run(args.quick))


if __name__ == "__main__":
    main()
