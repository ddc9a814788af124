"""Workflow length: steps/s of workflows of K trivial steps (K = 5, 50, 2,000, 20,000) on
both stores, each with its ratio to K = 5 from the same run, and one workflow of 100,000
steps on SQLite with the worker's peak RSS and what its claim costs to load the journal.

A step's cost must not grow with the steps before it: each commit writes its new journal
row and the small head (``runifold_sync/model/checkpoint.py``), never the whole journal again.
Each figure is one worker in one process, a plain loop of ``run_once`` over the
workflows (a workflow runs in one claim), as a plain script would drive it.

The 100,000-step workflow sleeps after its steps and finishes with one more: the second
claim loads the whole journal (one read, one parse) and replays every step without
running it. It runs in a child process (``--long-child``), so its peak RSS (``VmHWM``)
is its own.

``python benchmarks/journal_length.py [--quick]`` (``--quick``: about 2,000 steps per K
below 20,000 instead of 5,000, and the long workflow at 100,000 all the same).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta

from common import HERE, Row, arg_parser, fresh_store, print_table, progress, retry_on_restart

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)
from runifold_sync.store.checkpoints import read_checkpoint

LENGTHS = (5, 50, 2_000, 20_000)
LONG = 100_000
MB = 1024 * 1024
LABELS = {"sqlite": "SQLite FULL", "postgres": "PostgreSQL"}

long_flow = Workflow("bench-long", 1)


@long_flow.step()
def tick(ctx: StepContext, value: int) -> int:
    return value + 1


@long_flow.main
def run_long(ctx: WorkflowContext, steps: int) -> int:
    """``steps`` trivial steps, a durable sleep (the claim ends), one more step."""
    value = 0
    for _ in range(steps):
        value = tick(ctx, value)
    ctx.sleep(timedelta(seconds=1))
    return tick(ctx, value)


def _worker(store: WorkflowStore) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(long_flow))
    lease = LeaseDuration(timedelta(minutes=10))
    return WorkflowWorker(store, registry, WorkerId.parse("bench-length"), lease, timedelta(minutes=1))


@retry_on_restart
def steps_per_s(kind: str, length: int, total_steps: int) -> float:
    """Steps/s of ``total_steps // length`` (at least 1) workflows of ``length`` steps: the
    time includes each workflow's claim and its suspension at the sleep, and the step
    after the sleep is never run, so short workflows carry their fixed cost per step."""
    workflows = max(1, total_steps // length)
    with fresh_store(kind) as url:
        store = open_store(url)
        worker = _worker(store)
        try:
            for _ in range(workflows):
                store.enqueue(WorkflowTask.new("bench-long", 1, length))
            started = time.perf_counter()
            for _ in range(workflows):
                outcome = worker.run_once()
                if outcome.kind != "suspended":
                    raise RuntimeError(f"expected the workflow to sleep after its steps, got {outcome}")
            return workflows * length / (time.perf_counter() - started)
        finally:
            worker.close()
            store.close()


def long_child(url: str, steps: int) -> None:
    """Run one ``steps``-long workflow to its end in this process and print its figures."""
    store = open_store(url)
    worker = _worker(store)
    try:
        store.enqueue(WorkflowTask.new("bench-long", 1, steps, checkpoint_id="long"))
        started = time.perf_counter()
        first = worker.run_once()
        run_s = time.perf_counter() - started
        assert first.kind == "suspended", first
        started = time.perf_counter()
        checkpoint = read_checkpoint(store, "long")
        load_s = time.perf_counter() - started
        assert checkpoint is not None and len(checkpoint.journal) == steps + 1
        del checkpoint
        store.set_clock_offset(timedelta(seconds=2))  # past the sleep
        started = time.perf_counter()
        last = worker.run_once()  # loads the journal and replays it, then one step
        resume_s = time.perf_counter() - started
        assert last.kind == "completed", last
    finally:
        worker.close()
        store.close()
    with open("/proc/self/status") as status:
        peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps({"run_s": run_s, "load_s": load_s, "resume_s": resume_s, "peak_bytes": peak_kb * 1024}))


@retry_on_restart
def long_workflow(steps: int) -> dict[str, float]:
    with fresh_store("sqlite") as url:
        script = HERE / "journal_length.py"
        done = subprocess.run(
            [sys.executable, str(script), "--long-child", url, str(steps)], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"the long workflow's process failed: {done.stderr[-2000:]}")
        figures: dict[str, float] = json.loads(done.stdout)
        return figures


def run(quick: bool) -> list[Row]:
    total = 2_000 if quick else 5_000
    rows = []
    measured: dict[str, dict[int, float]] = {}
    for kind in ("sqlite", "postgres"):
        label = LABELS[kind]
        rates = measured[kind] = {}
        for length in LENGTHS:
            progress(f"journal length: {label}, K={length}")
            rates[length] = steps_per_s(kind, length, max(total, length))
        base = rates[5]
        for length in LENGTHS:
            ratio = rates[length] / base
            target = length in (2_000, 20_000)
            rows.append(
                Row(
                    f"{label}, 1 process, workflows of K={length:,} steps: steps/s",
                    f"{rates[length]:,.0f}/s",
                    "baseline" if length == 5 else f"{ratio:.2f}x K=5",
                    ">= 0.8x K=5" if target else "",
                    ratio >= 0.8 if target else None,
                )
            )
    progress(f"journal length: one workflow of {LONG:,} steps on SQLite, in its own process")
    long = long_workflow(LONG)
    rows.append(
        Row(
            f"SQLite FULL, one workflow of {LONG:,} steps: steps/s",
            f"{LONG / long['run_s']:,.0f}/s",
            f"{LONG / long['run_s'] / measured['sqlite'][5]:.2f}x K=5",
        )
    )
    rows.append(
        Row(
            f"SQLite FULL, one workflow of {LONG:,} steps: worker peak RSS",
            f"{long['peak_bytes'] / MB:.1f} MB",
            "",
            "< 150 MB",
            long["peak_bytes"] < 150 * MB,
        )
    )
    rows.append(
        Row(
            f"SQLite FULL, one workflow of {LONG:,} steps: loading its journal",
            f"{long['load_s'] * 1000:,.0f} ms",
            f"{long['load_s'] / LONG * 1e6:.1f} µs per entry (read and decoded, as a claim does)",
        )
    )
    rows.append(
        Row(
            f"SQLite FULL, one workflow of {LONG:,} steps: the claim after its sleep",
            f"{long['resume_s'] * 1000:,.0f} ms",
            f"{long['resume_s'] / long['run_s'] * 100:.1f}% of the first claim's {long['run_s']:.1f} s: "
            f"the journal loaded and {LONG:,} steps replayed, one step run",
        )
    )
    return rows


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--long-child":
        long_child(sys.argv[2], int(sys.argv[3]))
        return
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="about 2,000 steps per K instead of 5,000")
    args = parser.parse_args()
    print_table("Workflow length", run(args.quick))


if __name__ == "__main__":
    main()
