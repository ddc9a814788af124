"""CPU per step of the worker's hot path (step commits, completion with the next claim,
replay), in this process, beside the client CPU of one raw committed UPDATE on the same store.

``python benchmarks/cpu_per_step.py [--profile]``: with ``--profile`` it also prints the
top functions of a cProfile run (by own time and by cumulative time).
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time
from dataclasses import dataclass
from datetime import timedelta

import payload_flow
from commit_limit import Write, measure_commit_loop, measure_write_loop
from common import (
    Row,
    arg_parser,
    enqueue_workflows,
    fresh_store,
    print_table,
    progress,
    registry,
    server_cpu_s,
)

from runifold_sync import LeaseDuration, WorkerId, WorkflowDefinition, WorkflowWorker, open_store
from runifold_sync.model.checkpoint import DEFAULT_MAX_ENTRY_BYTES, MAIN, Checkpoint, JournalEntry
from runifold_sync.outcomes import Completed
from runifold_sync.store import DefinitionIdentity, TaskState


def _server_spent(before: float | None) -> float | None:
    after = server_cpu_s()
    return None if before is None or after is None else after - before


@dataclass(frozen=True)
class CpuPerStep:
    wall_s: float
    cpu_s: float
    steps: int
    server_s: float | None = None  # PostgreSQL server CPU over the run

    @property
    def cpu_us_per_step(self) -> float:
        return self.cpu_s / self.steps * 1e6

    @property
    def wall_us_per_step(self) -> float:
        return self.wall_s / self.steps * 1e6


def measure_worker(
    url: str,
    *,
    workflows: int,
    steps: int,
    profiler: cProfile.Profile | None = None,
    pages: bool = False,
) -> CpuPerStep:
    """Run ``workflows`` tasks to completion with one in-process worker (with ``pages``,
    of ``payload_flow``, whose steps return 5.6 KB objects)."""
    store = open_store(url)
    lease = LeaseDuration(timedelta(seconds=30))
    served = registry()
    if pages:  # only here: every other figure serves the definitions it always served
        served.register(WorkflowDefinition(payload_flow.flow))
    worker = WorkflowWorker(store, served, WorkerId.parse("cpu-0"), lease, timedelta(seconds=10))
    try:
        if pages:
            store.enqueue_many(payload_flow.tasks(workflows, steps))
        else:
            enqueue_workflows(store, workflows, steps, delay=None)
        worker.run_once(claim_next=True)  # warm up: connections, caches
        if profiler is not None:
            profiler.enable()
        server0 = server_cpu_s() if url.startswith("postgresql") else None
        wall0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(workflows - 1):
            outcome = worker.run_once(claim_next=True)  # as a pool's worker does
            if not isinstance(outcome, Completed):
                raise RuntimeError(f"unexpected outcome {outcome!r}")
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        server = _server_spent(server0)
        if profiler is not None:
            profiler.disable()
    finally:
        worker.close()
        store.close()
    return CpuPerStep(wall, cpu, (workflows - 1) * steps, server)


@dataclass(frozen=True)
class RawCommits:
    """Single-row UPDATE commits on one connection: how many, the client's CPU and wall
    time, and the server's CPU (PostgreSQL on this machine only)."""

    commits: int
    cpu_s: float
    wall_s: float
    server_s: float | None

    def plus(self, other: RawCommits) -> RawCommits:
        server = None if self.server_s is None or other.server_s is None else self.server_s + other.server_s
        return RawCommits(
            self.commits + other.commits, self.cpu_s + other.cpu_s, self.wall_s + other.wall_s, server
        )


def raw_commits(kind: str) -> RawCommits:
    with fresh_store(kind) as url:
        server0 = server_cpu_s() if kind == "postgres" else None
        loop = measure_commit_loop(url, duration_s=1.0)
        return RawCommits(loop.commits, loop.cpu_s, loop.wall_s, _server_spent(server0))


def head_writes(url: str) -> RawCommits:
    """The least write a step makes: the heads of two finished 5-step workflows written
    in turn to one task row (autocommit, unfenced, no clock, nothing returned), on one
    connection for a second. What any step costs the store with this schema before the
    engine does anything: the row's width, its JSONB head and the charge trigger's check."""
    with open_store(url) as store:
        tasks = store.list_tasks(state=TaskState.TERMINAL, limit=2)
        heads = [store.get_task(task.task_id).checkpoint_json for task in tasks]
    task_id = tasks[0].task_id
    write = Write(
        "UPDATE runifold_tasks SET head = ? WHERE task_id = ?",
        "UPDATE runifold_tasks SET head = %s::jsonb WHERE task_id = %s",
        tuple((head, task_id) for head in heads),
    )
    server0 = server_cpu_s() if url.startswith("postgresql") else None
    loop = measure_write_loop(url, write, duration_s=1.0)
    return RawCommits(loop.commits, loop.cpu_s, loop.wall_s, _server_spent(server0))


def run(quick: bool) -> list[Row]:
    workflows = 100 if quick else 500
    rows = []
    for kind, label in (("sqlite", "SQLite FULL"), ("postgres", "PostgreSQL")):
        progress(f"cpu per step: {label}")
        # The raw commits right before and right after the worker, counted together: on
        # a machine whose speed swings by the minute, one sample taken after the worker
        # moved the ratio by a quarter between runs.
        first = raw_commits(kind)
        with fresh_store(kind) as url:
            result = measure_worker(url, workflows=workflows, steps=5)
            head = head_writes(url)
        with fresh_store(kind) as url:
            paged = measure_worker(url, workflows=workflows // 2, steps=5, pages=True)
        raw = first.plus(raw_commits(kind))
        raw_server = raw.server_s
        raw_cpu_us = raw.cpu_s / raw.commits * 1e6
        rows.append(
            Row(
                f"{label}: worker CPU per step (1 process, 5-step workflows)",
                f"{result.cpu_us_per_step:,.0f} µs",
                f"{result.cpu_us_per_step / raw_cpu_us:.1f}x client CPU of a raw UPDATE commit "
                f"({raw_cpu_us:,.0f} µs)",
            )
        )
        rows.append(
            Row(
                f"{label}: worker CPU per step, steps returning a 5.6 KB object",
                f"{paged.cpu_us_per_step:,.0f} µs",
                f"{paged.cpu_us_per_step / result.cpu_us_per_step:.1f}x steps returning an integer",
            )
        )
        rows.append(
            Row(
                f"{label}: worker wall time per step",
                f"{result.wall_us_per_step:,.0f} µs",
                f"{result.wall_us_per_step / (raw.wall_s / raw.commits * 1e6):.1f}x wall of a raw "
                "UPDATE commit",
            )
        )
        if result.server_s is not None and raw_server is not None:
            cores = os.cpu_count() or 1
            server_us = result.server_s / result.steps * 1e6
            total_us = result.cpu_us_per_step + server_us
            raw_server_us = raw_server / raw.commits * 1e6
            rows.append(
                Row(
                    f"{label}: server CPU per step (all server processes)",
                    f"{server_us:,.0f} µs",
                    f"{server_us / raw_server_us:.1f}x server CPU of a raw UPDATE commit "
                    f"({raw_server_us:,.0f} µs)",
                )
            )
            raw_total_us = raw_cpu_us + raw_server_us
            rows.append(
                Row(
                    f"{label}: whole-machine CPU per step (worker and server, 1 process)",
                    f"{total_us:,.0f} µs",
                    f"{total_us / raw_total_us:.2f}x a raw single-row UPDATE commit's "
                    f"({raw_total_us:,.0f} µs); "
                    f"at this cost {cores} saturated cores make {cores * 1e6 / total_us:,.0f} steps/s",
                    "<= 2x a raw UPDATE commit",
                    total_us <= 2 * raw_total_us,
                )
            )
            assert head.server_s is not None
            head_us = (head.cpu_s + head.server_s) / head.commits * 1e6
            rows.append(
                Row(
                    f"{label}: whole-machine CPU of a step's least write (its head alone, unfenced)",
                    f"{head_us:,.0f} µs",
                    f"{head_us / raw_total_us:.2f}x a raw single-row UPDATE commit's; "
                    f"{head_us / total_us:.0%} of a step's CPU",
                )
            )
        else:
            head_wall_us = head.wall_s / head.commits * 1e6
            raw_wall_us = raw.wall_s / raw.commits * 1e6
            rows.append(
                Row(
                    f"{label}: wall time of a step's least write (its head alone, unfenced)",
                    f"{head_wall_us:,.0f} µs",
                    f"{head_wall_us / raw_wall_us:.2f}x a raw UPDATE commit's; "
                    f"{head_wall_us / result.wall_us_per_step:.0%} of a step's wall time",
                )
            )
    short, long = (checkpoint_encode_us(entries) for entries in (5, LONG_JOURNAL))
    rows.append(
        Row(
            f"checkpoint write at each commit, {LONG_JOURNAL}-entry journal",
            f"{long:,.0f} µs",
            f"{long / short:.1f}x a 5-entry journal ({short:,.0f} µs); {LONG_JOURNAL // 5}x the entries",
        )
    )
    return rows


LONG_JOURNAL = 500


def checkpoint_encode_us(entries: int) -> float:
    """Time of one more commit's encoding of a checkpoint with ``entries`` stored finished
    steps (what a long workflow pays at every step): the new entry and the head."""
    checkpoint = Checkpoint(DefinitionIdentity("bench-flow", 1, "f" * 64))
    for n in range(entries):
        checkpoint.append(MAIN, JournalEntry(f"work#{n + 1}", "step", "done", {"value": n, "note": "x" * 20}))
    checkpoint.stored(checkpoint.write("bench", DEFAULT_MAX_ENTRY_BYTES))
    rounds = 300
    started = time.perf_counter()
    for n in range(rounds):
        checkpoint.append(MAIN, JournalEntry(f"more#{n + 1}", "step", "done", {"value": n, "note": "x" * 20}))
        checkpoint.usage = checkpoint.usage.add(steps=1)
        checkpoint.stored(checkpoint.write("bench", DEFAULT_MAX_ENTRY_BYTES))
    return (time.perf_counter() - started) / rounds * 1e6


def profile(kind: str, workflows: int, top: int) -> None:
    profiler = cProfile.Profile()
    with fresh_store(kind) as url:
        result = measure_worker(url, workflows=workflows, steps=5, profiler=profiler)
    cpu, wall = result.cpu_us_per_step, result.wall_us_per_step
    print(f"\n{kind}: {cpu:,.0f} µs CPU and {wall:,.0f} µs wall per step")
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(order).print_stats(top)
        print(out.getvalue())


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--profile", action="store_true", help="print cProfile top functions")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    print_table("CPU per step", run(args.quick))
    if args.profile:
        for kind in ("sqlite", "postgres"):
            profile(kind, 100 if args.quick else 500, args.top)


if __name__ == "__main__":
    main()
