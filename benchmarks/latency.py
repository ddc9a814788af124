"""Idle pickup latency: from the enqueue call to the start of the first step body, for a
pool that has been idle (a random 0.1-0.6 s between samples, so the workers are in
their idle waits at random phases). PostgreSQL wakes workers with LISTEN/NOTIFY (pool of
4); SQLite has no notifications and its workers poll (pool of 1, the CLI default), so
its figure is set beside the configured minimum idle backoff: the default 25 ms, and
5 ms to show whether pickup follows the setting.
``python benchmarks/latency.py [--samples N] [--quick]``.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from datetime import timedelta

from common import (
    DEFAULT_MIN_BACKOFF,
    Row,
    arg_parser,
    fresh_store,
    print_table,
    progress,
    retry_on_restart,
    running_pool,
)

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.store import TaskState


def _step_started_at(store: WorkflowStore, task_id: str, timeout_s: float = 30.0) -> float:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = store.get_task(task_id)
        if record.state is TaskState.TERMINAL:
            assert record.result_json is not None, record.reason
            return float(json.loads(record.result_json))
        time.sleep(0.002)
    raise TimeoutError(f"task {task_id} not finished within {timeout_s} s")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


@retry_on_restart
def measure(kind: str, processes: int, samples: int, min_backoff: timedelta) -> list[float]:
    """Pickup latencies in seconds (the first sample, which warms up, is dropped)."""
    latencies = []
    with fresh_store(kind) as url:
        store = open_store(url)
        try:
            with running_pool(url, processes, min_backoff=min_backoff):
                time.sleep(1.0)  # every worker up and idle
                for i in range(samples + 1):
                    time.sleep(random.uniform(0.1, 0.6))
                    task = WorkflowTask.new("bench-latency", 1, f"sample-{i}")
                    enqueued = time.time()
                    store.enqueue(task)
                    started = _step_started_at(store, task.task_id)
                    if i:
                        latencies.append(started - enqueued)
        finally:
            store.close()
    return latencies


CONFIGS = (
    ("postgres", "PostgreSQL (LISTEN/NOTIFY)", 4, DEFAULT_MIN_BACKOFF),
    ("sqlite", "SQLite", 1, DEFAULT_MIN_BACKOFF),
    ("sqlite", "SQLite", 1, timedelta(milliseconds=5)),
)


def run(quick: bool, samples: int | None = None) -> list[Row]:
    samples = samples or (20 if quick else 200)
    rows = []
    for kind, label, processes, min_backoff in CONFIGS:
        backoff_ms = min_backoff / timedelta(milliseconds=1)
        progress(f"latency: {label}, pool of {processes}, min backoff {backoff_ms:g} ms, {samples} samples")
        ms = [s * 1000 for s in measure(kind, processes, samples, min_backoff)]
        p50, p99 = statistics.median(ms), percentile(ms, 0.99)
        name = f"idle pickup latency, {label}, pool of {processes}, min backoff {backoff_ms:g} ms"
        if kind == "postgres":
            rows.append(Row(f"{name}: p50", f"{p50:.1f} ms", "", "< 20 ms", p50 < 20))
        else:
            rows.append(
                Row(
                    f"{name}: p50",
                    f"{p50:.1f} ms",
                    f"min backoff {p50 - backoff_ms:+.1f} ms",
                    f"<= min backoff + 10 ms ({backoff_ms + 10:g} ms)",
                    p50 <= backoff_ms + 10,
                )
            )
        rows.append(Row(f"{name}: p99", f"{p99:.1f} ms", f"{p99 / p50:.1f}x p50 ({len(ms)} samples)"))
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--samples", type=int, default=None, help="default 200 (20 with --quick)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print_table("Idle pickup latency", run(args.quick, args.samples))


if __name__ == "__main__":
    main()
