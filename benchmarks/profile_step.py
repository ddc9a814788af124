"""Python function calls and SQLite VM operations per task of the worker's hot path.

``python benchmarks/profile_step.py [--tasks 200] [--top 25] [--claim-batch 1]``

Runs ``--tasks`` one-step tasks, then ``--tasks`` five-step workflows (``bench-flow``),
each on a fresh SQLite file with one in-process worker that claims, runs and commits
(``run_once(claim_next=True)``, the cycle a pool's worker repeats; with a claim batch
above 1, ``run(max_tasks=...)``, the loop that holds completions for one commit). The
first task of each shape warms up (registration, connections, statement caches) and is
not counted. For each shape it prints the Python function calls per task under cProfile,
the SQLite virtual machine operations per task of the worker's connection (a progress
handler called at every operation), and the top functions by calls and by own time.

Every figure but the own times is deterministic: call and VM-op counts do not depend on
the machine's speed or load, so they compare revisions on a shared machine where timings
cannot. The claim size is fixed (``claim_batch="auto"`` sizes claims by measured task
durations, which would make the counts vary).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from common import arg_parser, enqueue_workflows, fresh_sqlite, registry

from runifold_sync import CancellationToken, LeaseDuration, WorkerId, WorkflowWorker, open_store
from runifold_sync.outcomes import Completed
from runifold_sync.store.sqlite.store import SqliteWorkflowStore


@dataclass
class VmOps:
    """SQLite VM operations counted by a progress handler (called at every operation)."""

    count: int = 0

    def tick(self) -> int:
        self.count += 1
        return 0  # go on


_TICK = VmOps.tick.__code__


@dataclass(frozen=True)
class Profile:
    steps: int
    tasks: int
    calls: int
    vm_ops: int
    stats: pstats.Stats

    @property
    def calls_per_task(self) -> float:
        return self.calls / self.tasks

    @property
    def vm_ops_per_task(self) -> float:
        return self.vm_ops / self.tasks


@contextmanager
def counting_vm_ops(store: SqliteWorkflowStore) -> Iterator[VmOps]:
    """Count the VM operations of the connections the store has opened (the worker's
    thread's; the heartbeat thread opens its own only when it beats)."""
    ops = VmOps()
    raws: list[sqlite3.Connection] = [conn.raw for conn in store.dialect.connections]
    for raw in raws:
        raw.set_progress_handler(ops.tick, 1)
    try:
        yield ops
    finally:
        for raw in raws:
            raw.set_progress_handler(None, 1)


def profile(steps: int, tasks: int, claim_batch: int) -> Profile:
    """Run ``tasks`` workflows of ``steps`` steps after one warm-up task, profiled."""
    with fresh_sqlite() as url, open_store(url) as store:
        assert isinstance(store, SqliteWorkflowStore)
        enqueue_workflows(store, tasks + 1, steps, delay=None)
        worker = WorkflowWorker(
            store,
            registry(),
            WorkerId.parse("profile-0"),
            LeaseDuration(timedelta(seconds=300)),
            timedelta(seconds=100),
            claim_batch=claim_batch,
        )
        try:
            first = worker.run_once(claim_next=True)  # warm up: connections, caches
            if not isinstance(first, Completed):
                raise RuntimeError(f"unexpected outcome {first!r}")
            profiler = cProfile.Profile()
            with counting_vm_ops(store) as ops:
                profiler.enable()
                if claim_batch > 1:
                    report = worker.run(CancellationToken(), max_tasks=tasks)
                    done = report.outcomes.get("completed", 0)
                else:
                    done = 0
                    for _ in range(tasks):
                        done += isinstance(worker.run_once(claim_next=True), Completed)
                profiler.disable()
            if done != tasks:
                raise RuntimeError(f"{done} of {tasks} tasks completed")
        finally:
            worker.close()
    stats = pstats.Stats(profiler)
    table = stats.stats  # type: ignore[attr-defined]
    # The progress handler's own calls are the VM-op count, not the worker's calls.
    for key in [key for key in table if (key[0], key[2]) == (_TICK.co_filename, _TICK.co_name)]:
        del table[key]
    calls = sum(entry[1] for entry in table.values())
    return Profile(steps, tasks, calls, ops.count, stats)


def _top(stats: pstats.Stats, key: str, count: int) -> str:
    out = io.StringIO()
    stats.stream = out  # type: ignore[attr-defined]
    stats.sort_stats(key).print_stats(count)
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    return "\n".join(lines[start:])


def main() -> None:
    parser = arg_parser(__doc__ or "")
    parser.add_argument("--tasks", type=int, default=200, help="tasks per shape (default 200)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per table (default 25)")
    parser.add_argument("--claim-batch", type=int, default=1, help="the worker's claim_batch (default 1)")
    parser.add_argument("--shape", choices=("1", "5", "both"), default="both", help="steps per task")
    args = parser.parse_args()
    shapes = (1, 5) if args.shape == "both" else (int(args.shape),)
    results = [profile(steps, args.tasks, args.claim_batch) for steps in shapes]
    for result in results:
        label = "one-step tasks" if result.steps == 1 else f"{result.steps}-step workflows"
        if args.top:
            print(f"\n=== {label}, claim batch {args.claim_batch}, {result.tasks} tasks ===")
            print(f"\n--- top {args.top} by calls ---")
            print(_top(result.stats, "ncalls", args.top))
            print(f"\n--- top {args.top} by own time ---")
            print(_top(result.stats, "tottime", args.top))
    print()
    for result in results:
        label = "one-step task" if result.steps == 1 else f"{result.steps}-step workflow"
        print(
            f"{label}: {result.calls_per_task:,.1f} Python calls per task, "
            f"{result.vm_ops_per_task:,.1f} SQLite VM ops per task"
        )


if __name__ == "__main__":
    main()
