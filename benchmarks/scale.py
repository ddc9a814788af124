"""Claim throughput as the table grows: one process calling ``store.claim`` (one task per
claim, with the routes of a worker serving bench-flow v1, as a worker claims) over M
ready tasks, in four databases per store: only the M ready tasks; plus 1,000,000
finished tasks; plus 10,000 waiting tasks (half on timers a day away, half waiting for a
signal); plus 10,000 ready tasks of a definition the worker does not serve, due before
any of its own. Rows are inserted with bulk SQL (``generate_series`` on PostgreSQL,
followed by ``VACUUM ANALYZE`` as autovacuum would do; one ``executemany`` transaction on
SQLite), finished rows with the head of a 5-step checkpoint. Claims alternate between the
four databases in rounds, so machine noise hits them all alike; each
figure is the best round. Then ``queue_stats`` (the ``stats`` command) is timed in the
first two databases, the best of 20 calls each, in turns: it must stay flat with the
finished tasks (it reads unfinished tasks only, and the finished counters).
``python benchmarks/scale.py [--finished N] [--quick]``.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import timedelta

import psycopg
from common import (
    Row,
    arg_parser,
    bench_flow,
    fresh_store,
    print_table,
    progress,
    rate,
    retry_on_restart,
)

from runifold_sync import BudgetUsage, LeaseDuration, WorkerId, WorkflowDefinition, WorkflowStore, open_store
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.store.open import sqlite_path
from runifold_sync.store.records import Routes

ROUNDS = 6
WAITING = 10_000
UNSERVED = 10_000
_COLUMNS = (
    "task_id, definition_name, definition_version, tenant, input, priority, state, outcome, ready_at, "
    "waiting_for_signal, revision, head, result, created_at, updated_at"
)


def finished_checkpoint() -> str:
    """The head a finished 5-step task keeps in its row. Its journal rows are left out:
    a claim never reads the journal of another task, so they do not change what is
    measured here, and 5 million of them would make the fill take longer than the run."""
    identity = WorkflowDefinition(bench_flow).identity
    usage = BudgetUsage(steps=5, claims=1)
    return Checkpoint(identity, phase="completed", usage=usage).write("finished", 1 << 20).head_json


def _pg_rows(url: str, sql: str, params: dict[str, object]) -> None:
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(sql, params)


def fill_postgres(url: str, *, ready: int, finished: int, waiting: int, unserved: int = 0) -> None:
    select = (
        "INSERT INTO runifold_tasks ({cols}) SELECT {prefix} || i, {name}, 1, 'default', '5'::jsonb, "
        "'5', 0, {state}, {outcome}, {ready_at}, {signal}, {revision}, {checkpoint}, {result}, "
        "clock_timestamp(), clock_timestamp() FROM generate_series(1, %(n)s) AS i"
    )
    cols = _COLUMNS.replace("input, priority", "input, input_text, priority")
    ckpt: dict[str, object] = {"checkpoint": finished_checkpoint()}
    if finished:
        sql = select.format(
            cols=cols,
            name="'bench-flow'",
            prefix="'done-'",
            state="'terminal'",
            outcome="'completed'",
            ready_at="NULL",
            signal="NULL",
            revision=7,
            checkpoint="%(checkpoint)s::jsonb",
            result="'5'::jsonb",
        )
        _pg_rows(url, sql, {"n": finished} | ckpt)
    for half, ready_at, signal in (
        ("timer", "clock_timestamp() + interval '1 day'", "NULL"),
        ("signal", "NULL", "'approval'"),
    ):
        if waiting:
            sql = select.format(
                cols=cols,
                name="'bench-flow'",
                prefix=f"'wait-{half}-'",
                state="'waiting'",
                outcome="NULL",
                ready_at=ready_at,
                signal=signal,
                revision=2,
                checkpoint="%(checkpoint)s::jsonb",
                result="NULL",
            )
            _pg_rows(url, sql, {"n": waiting // 2} | ckpt)
    if unserved:
        sql = select.format(
            cols=cols,
            name="'elsewhere-flow'",
            prefix="'unserved-'",
            state="'queued'",
            outcome="NULL",
            ready_at="clock_timestamp() - interval '1 hour' + i * interval '1 microsecond'",
            signal="NULL",
            revision=0,
            checkpoint="NULL",
            result="NULL",
        )
        _pg_rows(url, sql, {"n": unserved})
    sql = select.format(
        cols=cols,
        name="'bench-flow'",
        prefix="'ready-'",
        state="'queued'",
        outcome="NULL",
        ready_at="clock_timestamp() - interval '1 second' + i * interval '1 microsecond'",
        signal="NULL",
        revision=0,
        checkpoint="NULL",
        result="NULL",
    )
    _pg_rows(url, sql, {"n": ready})
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("VACUUM ANALYZE runifold_tasks")


def fill_sqlite(url: str, *, ready: int, finished: int, waiting: int, unserved: int = 0) -> None:
    now_us = int(time.time() * 1e6)
    day_us = 86_400 * 10**6
    checkpoint = finished_checkpoint()
    served = "bench-flow"

    def rows() -> Iterator[tuple[object, ...]]:
        for i in range(finished):
            yield (f"done-{i}", served, "terminal", "completed", None, None, 7, checkpoint, "5")
        for i in range(waiting // 2):
            yield (f"wait-timer-{i}", served, "waiting", None, now_us + day_us, None, 2, checkpoint, None)
            yield (f"wait-signal-{i}", served, "waiting", None, None, "approval", 2, checkpoint, None)
        for i in range(unserved):
            yield (
                f"unserved-{i}",
                "elsewhere-flow",
                "queued",
                None,
                now_us - 3600 * 10**6 + i,
                None,
                0,
                None,
                None,
            )
        for i in range(ready):
            yield (f"ready-{i}", served, "queued", None, now_us - 10**6 + i, None, 0, None, None)

    sql = (
        f"INSERT INTO runifold_tasks ({_COLUMNS}) VALUES "
        f"(?, ?, 1, 'default', '5', 0, ?, ?, ?, ?, ?, ?, ?, {now_us}, {now_us})"
    )
    conn = sqlite3.connect(sqlite_path(url), isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows())
        conn.execute("COMMIT")
    finally:
        conn.close()


def claim_rate(stores: dict[str, WorkflowStore], ready: int) -> dict[str, float]:
    """Claims per second in each store: ``ROUNDS`` rounds of ``ready / ROUNDS`` claims,
    taken in turns across the stores; the best round of each (other load on the machine
    only ever slows a round down)."""
    worker, lease = WorkerId.parse("scale-0"), LeaseDuration(timedelta(minutes=10))
    routes = Routes.serving(
        ["default"], [("bench-flow", 1, WorkflowDefinition(bench_flow).identity.fingerprint)]
    )
    best = dict.fromkeys(stores, 0.0)
    per_round = ready // ROUNDS
    for _ in range(ROUNDS):
        for name, store in stores.items():
            started = time.perf_counter()
            for _ in range(per_round):
                if len(store.claim(worker, lease, limit=1, routes=routes)) != 1:
                    raise RuntimeError(f"{name}: a claim found no ready task")
            best[name] = max(best[name], per_round / (time.perf_counter() - started))
    return best


def stats_ms(stores: dict[str, WorkflowStore]) -> dict[str, float]:
    """The best of ``STATS_CALLS`` calls of ``queue_stats`` in each store, in turns, in ms."""
    best = dict.fromkeys(stores, float("inf"))
    for _ in range(STATS_CALLS):
        for name, store in stores.items():
            started = time.perf_counter()
            store.queue_stats()
            best[name] = min(best[name], (time.perf_counter() - started) * 1000)
    return best


STATS_CALLS = 20
CONFIGS = ("empty", "finished", "waiting", "unserved")


@retry_on_restart
def measure(kind: str, *, ready: int, finished: int) -> tuple[dict[str, float], dict[str, float]]:
    fill = fill_postgres if kind == "postgres" else fill_sqlite
    with ExitStack() as stack:
        stores = {}
        for config in CONFIGS:
            url = stack.enter_context(fresh_store(kind))
            store = open_store(url)
            stack.callback(store.close)
            progress(f"scale: {kind}, {config}: inserting rows")
            fill(
                url,
                ready=ready,
                finished=finished if config == "finished" else 0,
                waiting=WAITING if config == "waiting" else 0,
                unserved=UNSERVED if config == "unserved" else 0,
            )
            stores[config] = store
        progress(f"scale: {kind}: claiming {ready} tasks in each database")
        rates = claim_rate(stores, ready)
        progress(f"scale: {kind}: queue_stats")
        return rates, stats_ms({name: stores[name] for name in ("empty", "finished")})


def run(quick: bool, finished: int = 1_000_000) -> list[Row]:
    ready = 1800 if quick else 6000
    rows = []
    for kind, label in (("sqlite", "SQLite FULL"), ("postgres", "PostgreSQL")):
        rates, stats = measure(kind, ready=ready, finished=finished)
        empty = rates["empty"]
        rows.append(Row(f"{label}: claims/s, empty table ({ready} ready)", rate(empty), "baseline"))
        ratio = rates["finished"] / empty
        rows.append(
            Row(
                f"{label}: claims/s with {finished:,} finished tasks",
                rate(rates["finished"]),
                f"{ratio:.2f}x empty table",
                ">= 0.80x empty table",
                ratio >= 0.8,
            )
        )
        rows.append(
            Row(
                f"{label}: claims/s with {WAITING:,} waiting tasks",
                rate(rates["waiting"]),
                f"{rates['waiting'] / empty:.2f}x empty table",
            )
        )
        unserved_ratio = rates["unserved"] / empty
        rows.append(
            Row(
                f"{label}: claims/s with {UNSERVED:,} queued tasks of a definition it does not serve",
                rate(rates["unserved"]),
                f"{unserved_ratio:.2f}x empty table",
                ">= 0.80x empty table",
                unserved_ratio >= 0.8,
            )
        )
        rows.append(Row(f"{label}: queue_stats, empty table", f"{stats['empty']:.2f} ms", "baseline"))
        stats_ratio = stats["finished"] / stats["empty"]
        rows.append(
            Row(
                f"{label}: queue_stats with {finished:,} finished tasks",
                f"{stats['finished']:.2f} ms",
                f"{stats_ratio:.2f}x empty table",
                "<= 2.00x empty table",
                stats_ratio <= 2.0,
            )
        )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="1800 claims per database instead of 6000")
    args = parser.parse_args()
    print_table("Claim throughput at scale", run(args.quick, args.finished))


if __name__ == "__main__":
    main()
