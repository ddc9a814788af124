"""Result latency: from a task's completion committing (``store.complete`` returned, on a
store of its own, as a worker's would) to ``store.wait_for_task`` returning on another
store of the same database, p50 and p99. PostgreSQL wakes the waiter by NOTIFY over the
store's one LISTEN connection; SQLite by its change counter, read every 5 ms, so its
figure is set beside that poll interval. Each sample waits a random 20-120 ms after the
waiter began blocking, so the completion lands at a random phase of the SQLite poll.
``python benchmarks/wait_latency.py [--samples N] [--quick]``.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from datetime import timedelta

from common import Row, arg_parser, fresh_store, print_table, progress, retry_on_restart

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask, open_store

SQLITE_POLL_MS = 5.0  # store/sqlite.py _WAIT_POLL_S
LEASE = LeaseDuration(timedelta(seconds=30))


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def _wait(store: WorkflowStore, task_id: str, returned: list[float]) -> None:
    store.wait_for_task(task_id, timedelta(seconds=30))
    returned.append(time.monotonic())


@retry_on_restart
def measure(kind: str, samples: int) -> list[float]:
    """Latencies in seconds (the first sample, which opens the LISTEN connection, dropped)."""
    latencies = []
    with fresh_store(kind) as url:
        waiting, worker = open_store(url), open_store(url)
        try:
            for i in range(samples + 1):
                task = WorkflowTask.new("bench-wait", 1, i)
                waiting.enqueue(task)
                returned: list[float] = []
                thread = threading.Thread(target=_wait, args=(waiting, task.task_id, returned))
                thread.start()
                time.sleep(random.uniform(0.02, 0.12))
                [claimed] = worker.claim(WorkerId.parse("bench"), LEASE)
                worker.complete(claimed.lease, claimed.revision, "{}", "null")
                committed = time.monotonic()
                thread.join(timeout=30)
                if i:
                    latencies.append(returned[0] - committed)
        finally:
            waiting.close()
            worker.close()
    return latencies


def run(quick: bool, samples: int | None = None) -> list[Row]:
    samples = samples or (30 if quick else 200)
    rows = []
    for kind, label, target_ms in (("postgres", "PostgreSQL (NOTIFY)", 20.0), ("sqlite", "SQLite", 10.0)):
        progress(f"wait latency: {label}, {samples} samples")
        ms = [s * 1000 for s in measure(kind, samples)]
        p50, p99 = statistics.median(ms), percentile(ms, 0.99)
        name = f"completion to wait_for_task return, {label}"
        if kind == "postgres":
            rows.append(Row(f"{name}: p50", f"{p50:.1f} ms", "", f"< {target_ms:g} ms", p50 < target_ms))
        else:
            limit = target_ms + SQLITE_POLL_MS
            rows.append(
                Row(
                    f"{name}: p50",
                    f"{p50:.1f} ms",
                    f"poll interval {p50 - SQLITE_POLL_MS:+.1f} ms",
                    f"< 10 ms + poll interval ({limit:g} ms)",
                    p50 < limit,
                )
            )
        rows.append(Row(f"{name}: p99", f"{p99:.1f} ms", f"{p99 / p50:.1f}x p50 ({len(ms)} samples)"))
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--samples", type=int, default=None, help="default 200 (30 with --quick)")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print_table("Result latency", run(args.quick, args.samples))


if __name__ == "__main__":
    main()
