"""Retention on PostgreSQL: a pool's throughput while ``prune`` deletes many old tasks,
and the database's size in a steady-state soak under ``run --retention``.

1. N finished tasks (default 100,000; ``--finished 1000000`` for the issue's figure),
   each with the head of a 5-step checkpoint and 3 history events, finished 60 days
   ago, are inserted with bulk SQL and ``VACUUM ANALYZE``d. A pool of 4 workers
   (``benchmarks/pool.py``) drains 5-step workflows from a deep queue three times: alone,
   while ``python -m runifold_sync prune --older-than 30d`` (the operator's command, its
   own process, batches of 1,000, resting as its ``--share`` says: 0.25 by default,
   ``--share 1`` here for flat out) deletes the N tasks, and alone again. Each figure is
   completed workflows per second over a window from one second after the first claim:
   the prune's own duration for the middle run, ``BASELINE_WINDOW_S`` for the others.
   Ratio: the middle run against the mean of the two alone; target 0.7 or more.
2. Soak: ``run --retention 10s`` with 2 workers while a feeder enqueues
   ``SOAK_RATE`` workflows a second for ``--soak-s`` seconds (default 90); the stored
   tasks and the database's size (``pg_database_size``) are sampled every 10 s. Deleted
   rows are space for new ones only once vacuumed: on a server with ``autovacuum`` off
   (the shared test server is) the soak runs ``VACUUM`` on the store's tables every 10 s,
   as autovacuum would, and says so. Target: the size in the last third grows by at most
   10% over its value at two thirds.

``python benchmarks/prune.py [--finished N] [--share S] [--soak-s S] [--skip-soak]``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import psycopg
from common import (
    HERE,
    ROOT,
    Row,
    arg_parser,
    enqueue_workflows,
    fresh_postgres,
    print_table,
    progress,
    rate,
    retry_on_restart,
    running_pool,
)
from scale import finished_checkpoint

from runifold_sync import WorkflowStore, open_store

FINISHED = 100_000
POOL = 4
STEPS = 5
BASELINE_WINDOW_S = 10.0
WARM_UP_S = 1.0
SOAK_RATE = 40  # workflows enqueued per second in the soak
SOAK_RETENTION_S = 10
SOAK_SAMPLE_S = 10.0


def fill_finished(url: str, count: int) -> None:
    """``count`` tasks finished 60 days ago, each with three history events."""
    progress(f"inserting {count:,} finished tasks")
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, outcome, revision, head, result, created_at, updated_at) "
            "SELECT 'done-' || i, 'bench-flow', 1, 'default', '5'::jsonb, '5', 'terminal', 'completed', 7, "
            "%(head)s::jsonb, '5'::jsonb, now() - interval '60 days' + i * interval '1 ms', "
            "now() - interval '60 days' + i * interval '1 ms' FROM generate_series(1, %(n)s) AS i",
            {"n": count, "head": finished_checkpoint()},
        )
        pg.execute(
            "INSERT INTO runifold_events (task_id, at, kind, worker_id, fencing_token) "
            "SELECT 'done-' || i, now() - interval '60 days', k, 'bench-0', 1 "
            "FROM generate_series(1, %(n)s) AS i, unnest(ARRAY['enqueued', 'claimed', 'completed']) AS k",
            {"n": count},
        )
        pg.execute("VACUUM ANALYZE")
        # The fill's WAL is flushed now, not by a checkpoint in the middle of the first
        # baseline (one ran at 31 workflows/s against 476/s after the prune).
        pg.execute("CHECKPOINT")


def _one(url: str, sql: str, params: dict[str, object] | None = None) -> float:
    with psycopg.connect(url) as pg:
        row = pg.execute(sql.encode(), params).fetchone()
    assert row is not None
    return float(row[0])


def _first_claim(url: str, after: float) -> float:
    """Wall time of the pool's first claim after wall time ``after`` (the server's clock
    is this machine's)."""
    sql = (
        "SELECT COALESCE(EXTRACT(EPOCH FROM min(updated_at)), 0) FROM runifold_tasks "
        "WHERE state <> 'queued' AND updated_at > to_timestamp(%(after)s)"
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        first = _one(url, sql, {"after": after})
        if first:
            return first
        time.sleep(0.05)
    raise TimeoutError("the pool claimed nothing within 60 s")


def completed_per_s(url: str, start: float, end: float) -> float:
    """Workflows completed between wall times ``start`` and ``end``; refused when the
    queue ran dry before ``end`` (the pool would have idled)."""
    window = {"start": start, "end": end}
    done = _one(
        url,
        "SELECT count(*) FROM runifold_tasks WHERE state = 'terminal' "
        "AND updated_at BETWEEN to_timestamp(%(start)s) AND to_timestamp(%(end)s)",
        window,
    )
    left = _one(url, "SELECT count(*) FROM runifold_tasks WHERE state IN ('queued', 'leased')")
    if not left:
        raise RuntimeError("the queue ran dry during the window: enqueue more workflows")
    return done / (end - start)


def _analyze(url: str) -> None:
    """What autovacuum does after a bulk insert, on a server where it is off: planner
    statistics that count the new queued tasks."""
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("ANALYZE runifold_tasks")


def drain(url: str, store: WorkflowStore, queued: int, *, prune: float | None) -> tuple[float, float, int]:
    """One drain by a pool of ``POOL``: completed workflows per second over its window,
    the window's length, and (with ``prune``, the prune's ``--share``) how many tasks
    the prune deleted."""
    enqueued = time.time()
    enqueue_workflows(store, queued, STEPS, delay=timedelta(seconds=1.5))
    _analyze(url)
    with running_pool(url, POOL):
        start = _first_claim(url, enqueued) + WARM_UP_S
        time.sleep(max(0.0, start - time.time()))
        pruned = 0
        if prune is not None:
            command = [sys.executable, "-m", "runifold_sync", "prune", "--older-than", "30d", "--json"]
            command += ["--share", str(prune)]
            done = subprocess.run(
                [*command, "--database", url], cwd=ROOT, capture_output=True, text=True, check=True
            )
            pruned = json.loads(done.stdout)["pruned"]
        else:
            time.sleep(BASELINE_WINDOW_S)
        end = time.time()
        per_s = completed_per_s(url, start, end)
    return per_s, end - start, pruned


@retry_on_restart
def measure_prune(finished: int, share: float) -> list[Row]:
    with fresh_postgres() as url:
        store = open_store(url)
        try:
            fill_finished(url, finished)
            # Deep enough that no window runs dry: 4 workers did up to 550 workflows a
            # second here (2026-12-04; 6,000 ran dry within the 10 s window), and beside
            # them a prune deletes some 30,000 tasks a second.
            queued = max(12_000, finished // 25)
            progress("pool alone")
            alone_1, _, _ = drain(url, store, queued, prune=None)
            progress(f"pool while the prune deletes {finished:,} tasks")
            during, prune_s, pruned = drain(url, store, queued, prune=share)
            progress("pool alone again")
            alone_2, _, _ = drain(url, store, queued, prune=None)
        finally:
            store.close()
    if pruned != finished:
        raise RuntimeError(f"the prune deleted {pruned} tasks, not {finished}")
    alone = (alone_1 + alone_2) / 2
    ratio = during / alone
    return [
        Row(f"pool of {POOL} alone (5-step workflows)", f"{rate(alone_1)} then {rate(alone_2)}"),
        Row(
            f"pool of {POOL} while pruning {finished:,} tasks (--share {share:g})",
            rate(during),
            f"{ratio:.2f}x alone",
            ">= 0.7x",
            ratio >= 0.7,
        ),
        Row(
            f"prune of {finished:,} tasks (3 events each) beside the pool",
            f"{prune_s:.1f} s, {rate(finished / prune_s)}",
        ),
    ]


def _autovacuum_on(url: str) -> bool:
    with psycopg.connect(url) as pg:
        row = pg.execute("SELECT current_setting('autovacuum') = 'on'").fetchone()
    return bool(row and row[0])


def _vacuum(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("VACUUM runifold_tasks, runifold_events, runifold_journal")


def _sizes(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as pg:
        row = pg.execute(
            "SELECT (SELECT count(*) FROM runifold_tasks), pg_database_size(current_database())"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@retry_on_restart
def measure_soak(seconds: float) -> list[Row]:
    samples: list[tuple[float, int, int]] = []
    with fresh_postgres() as url:
        store = open_store(url)
        vacuums = not _autovacuum_on(url)
        if vacuums:
            progress("autovacuum is off on this server: the soak vacuums the store's tables every 10 s")
        command = [
            sys.executable,
            "-m",
            "runifold_sync",
            "run",
            "--app",
            "common:registry",
            "--database",
            url,
        ]
        command += ["--concurrency", "2", "--retention", f"{SOAK_RETENTION_S}s", "--log-level", "warning"]
        pool = subprocess.Popen(
            command,
            cwd=ROOT,
            env=os.environ | {"PYTHONPATH": str(HERE)},
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            started = next_sample = time.monotonic()
            while (elapsed := time.monotonic() - started) < seconds:
                enqueue_workflows(store, SOAK_RATE // 10, STEPS, delay=None)
                if time.monotonic() >= next_sample:
                    if vacuums:
                        _vacuum(url)
                    tasks, size = _sizes(url)
                    samples.append((elapsed, tasks, size))
                    progress(f"soak at {elapsed:.0f} s: {tasks:,} tasks stored, database {size / 1e6:.1f} MB")
                    next_sample += SOAK_SAMPLE_S
                time.sleep(0.1)
            if time.monotonic() - started - samples[-1][0] >= 1:
                samples.append((time.monotonic() - started, *_sizes(url)))
        finally:
            pool.send_signal(signal.SIGTERM)
            try:
                pool.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(pool.pid, signal.SIGKILL)
                pool.wait()
            store.close()
    rows = [
        Row(f"soak at {at:.0f} s", f"{tasks:,} tasks, {size / 1e6:.2f} MB") for at, tasks, size in samples
    ]
    two_thirds = min(samples, key=lambda s: abs(s[0] - seconds * 2 / 3))
    growth = samples[-1][2] / two_thirds[2]
    how = f"{SOAK_RATE}/s enqueued, --retention {SOAK_RETENTION_S}s" + (
        ", VACUUM every 10 s" if vacuums else ""
    )
    rows.append(
        Row(
            f"size growth in the last third ({how})",
            f"{two_thirds[2] / 1e6:.2f} MB -> {samples[-1][2] / 1e6:.2f} MB",
            f"{growth:.2f}x",
            "<= 1.10x",
            growth <= 1.10,
        )
    )
    return rows


def run(quick: bool) -> list[Row]:
    """``run_all.py``'s rows: 100,000 tasks pruned and a 45 s soak with ``quick``, the
    issue's 1,000,000 and 90 s without."""
    return measure_prune(FINISHED if quick else 1_000_000, 0.25) + measure_soak(45.0 if quick else 90.0)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--finished", type=int, default=FINISHED, help="old finished tasks to prune")
    parser.add_argument("--share", type=float, default=0.25, help="the prune's --share (1: flat out)")
    parser.add_argument("--soak-s", type=float, default=90.0, help="length of the steady-state soak")
    parser.add_argument("--skip-soak", action="store_true")
    args = parser.parse_args()
    rows = measure_prune(args.finished, args.share)
    if not args.skip_soak:
        rows += measure_soak(args.soak_s)
    print_table("retention (PostgreSQL)", rows)


if __name__ == "__main__":
    main()
