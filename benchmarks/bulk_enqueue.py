"""A producer's tasks/s with ``enqueue_many`` in batches of 128 one-step tasks, against
the per-task statements the same batches took before (``insert_task`` and
``insert_event``, two statements and on PostgreSQL two round trips a task, one
transaction a batch: the baseline) and against ``enqueue`` one task a call, in the same
run on the same fresh store per backend. Rounds alternate between the three ways (the
best round of each counts: other load on the machine only ever slows a round down); the
client process's CPU a task is shown too. Target: the bulk path at least 10x the
baseline's tasks/s on PostgreSQL. With ``--peers``, pgqueuer's ``enqueue`` and
procrastinate's ``batch_defer_async`` of the same batches, each on a fresh database from
the peers' virtualenv (``peers.py``), the best of the same number of rounds.
``python benchmarks/bulk_enqueue.py [--quick] [--backend sqlite|postgres|both] [--peers]``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Callable

from common import Row, arg_parser, fresh_store, not_measured, print_table, progress, rate, retry_on_restart

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.store import sql_operators

BATCH = 128
ROUNDS = 3
_ids = itertools.count()


def batch() -> list[WorkflowTask]:
    return [WorkflowTask.new("bench-bulk", 1, {"n": n}, checkpoint_id=f"b{next(_ids)}") for n in range(BATCH)]


def per_task(store: WorkflowStore, tasks: list[WorkflowTask]) -> None:
    """The baseline: the batch in one transaction, two statements a task (what
    ``enqueue_many`` sent for every task before the bulk statement)."""
    d = store.dialect
    with d.transaction() as tx:
        for task in tasks:
            sql_operators._insert_one(d, tx, task, sql_operators._task_params(d, task, None))
        d.notify(tx)


def bulk(store: WorkflowStore, tasks: list[WorkflowTask]) -> None:
    store.enqueue_many(tasks)


def one_at_a_time(store: WorkflowStore, tasks: list[WorkflowTask]) -> None:
    for task in tasks:
        store.enqueue(task)


WAYS: dict[str, Callable[[WorkflowStore, list[WorkflowTask]], None]] = {
    "per_task": per_task,
    "bulk": bulk,
    "one_at_a_time": one_at_a_time,
}


def enqueue_round(
    store: WorkflowStore, way: Callable[[WorkflowStore, list[WorkflowTask]], None], batches: int
) -> tuple[float, float]:
    """Tasks/s and client CPU µs a task over ``batches`` batches (tasks made beforehand)."""
    made = [batch() for _ in range(batches)]
    cpu, wall = time.process_time(), time.perf_counter()
    for tasks in made:
        way(store, tasks)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    count = batches * BATCH
    return count / wall, cpu / count * 1e6


@retry_on_restart
def measure(kind: str, batches: int) -> dict[str, tuple[float, float]]:
    with fresh_store(kind) as url, open_store(url) as store:
        best: dict[str, tuple[float, float]] = {}
        for n in range(ROUNDS):
            for name, way in WAYS.items():
                progress(f"bulk enqueue: {kind}, round {n + 1}, {name}")
                rate_s, cpu_us = enqueue_round(store, way, batches)
                if name not in best or rate_s > best[name][0]:
                    best[name] = (rate_s, cpu_us)
        return best


def peer_per_s(script: str, batches: int) -> float:
    """The best tasks/s of ``ROUNDS`` runs of ``script``'s ``bulk`` role, each on a
    fresh database after its ``setup`` (schema only)."""
    import peers

    best = 0.0
    for _ in range(ROUNDS):
        with fresh_store("postgres") as url:
            path = str(peers.HERE / script)
            for role in ("setup", "bulk"):
                args = [str(peers.PYTHON), path, role, "--url", url, "--count", str(batches * BATCH)]
                done = subprocess.run(args, capture_output=True, text=True, timeout=300)
                if done.returncode != 0:
                    raise peers.PeerFailed(f"{script} {role}: {peers._tail(done.stderr)}")
            found = json.loads(done.stdout.strip().splitlines()[-1])
            best = max(best, found["enqueued"] / found["seconds"])
    return best


def peer_rows(batches: int, ours: float) -> list[Row]:
    import peers

    versions = peers.install_peers()
    rows = []
    for name, script in (("pgqueuer", "peer_pgqueuer.py"), ("procrastinate", "peer_procrastinate.py")):
        figure = f"PostgreSQL: {name} {versions.get(name, '')} bulk enqueue of {BATCH}, tasks/s"
        if versions.get(name, "!").startswith("!"):
            rows.append(not_measured(figure, versions.get(name, "not installed")))
            continue
        try:
            progress(f"bulk enqueue: {name}")
            theirs = peer_per_s(script, batches)
        except (peers.PeerFailed, subprocess.TimeoutExpired) as exc:
            rows.append(not_measured(figure, str(exc)))
            continue
        rows.append(Row(figure, rate(theirs), f"runifold_sync {ours / theirs:.2f}x theirs"))
    return rows


def run(
    quick: bool, backends: tuple[str, ...] = ("sqlite", "postgres"), *, with_peers: bool = False
) -> list[Row]:
    batches = 3 if quick else 20
    rows = []
    for kind in backends:
        best = measure(kind, batches)
        name = "SQLite" if kind == "sqlite" else "PostgreSQL"
        (base, base_cpu), (fast, fast_cpu), (single, single_cpu) = (
            best["per_task"],
            best["bulk"],
            best["one_at_a_time"],
        )
        rows.append(
            Row(
                f"{name}: enqueue_many of {BATCH}, per-task statements (before), tasks/s",
                f"{rate(base)} ({base_cpu:,.0f} µs CPU a task)",
                "baseline",
            )
        )
        ratio = fast / base
        target = ">= 10x before" if kind == "postgres" else ""
        rows.append(
            Row(
                f"{name}: enqueue_many of {BATCH}, one statement, tasks/s",
                f"{rate(fast)} ({fast_cpu:,.0f} µs CPU a task)",
                f"{ratio:.2f}x before",
                target,
                ratio >= 10 if kind == "postgres" else None,
            )
        )
        rows.append(
            Row(
                f"{name}: enqueue one task a call, tasks/s",
                f"{rate(single)} ({single_cpu:,.0f} µs CPU a task)",
                f"{single / base:.2f}x before",
            )
        )
        if kind == "postgres" and with_peers:
            rows += peer_rows(batches, fast)
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="3 batches a round instead of 20")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument(
        "--peers", action="store_true", help="pgqueuer's and procrastinate's bulk enqueue too"
    )
    args = parser.parse_args()
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    print_table(f"enqueue_many in batches of {BATCH}", run(args.quick, backends, with_peers=args.peers))


if __name__ == "__main__":
    main()
