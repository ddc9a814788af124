"""The dashboard's server time with many tasks stored: p50 and p95 of the task list's
first page, a page deep into the table (keyset: it should cost what the first does), a
filtered page, the newest tasks first, the overview, a task's page, and the page of a task whose journal holds
1,000 entries, on SQLite and PostgreSQL. Requests go through the Flask app in-process
(routing, store reads, rendering; no network), each figure over ``--requests`` calls.

Tasks are enqueued through the store (``enqueue_many`` in batches), spread over 4
tenants and 3 definitions, with 200 of them run to the end for the throughput chart.
``python benchmarks/dashboard.py [--tasks N] [--requests R] [--quick]``; the issue's
figure is ``--tasks 1000000`` (seeding that many takes minutes per store).
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from urllib.parse import urlencode

from common import Row, arg_parser, bench_flow, fresh_store, print_table, progress, registry, retry_on_restart

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    WorkflowTask,
    open_store,
)
from runifold_sync.dashboard import create_app
from runifold_sync.store.sql_reads import page_cursor
from runifold_sync.testing import run_until_idle

TARGET_MS = 200.0
BATCH = 5_000
JOURNAL = 1_000


def seed(url: str, tasks: int) -> dict[str, str]:
    """``tasks`` tasks, 200 finished, and one with a 1,000-entry journal; returns the
    paths to measure."""
    with open_store(url) as store:
        # common's bench-flow: JOURNAL steps, each a journal entry.
        store.enqueue(WorkflowTask.new(bench_flow.name, 1, JOURNAL, checkpoint_id="long-journal"))
        run_until_idle(store, registry())  # first: it would meet the tasks it does not serve
        for start in range(0, tasks, BATCH):
            store.enqueue_many(
                [
                    WorkflowTask.new(
                        f"flow-{n % 3}", 1, {"n": n}, checkpoint_id=f"task-{n:08}", tenant=f"tenant-{n % 4}"
                    )
                    for n in range(start, min(start + BATCH, tasks))
                ]
            )
            progress(f"{url.split(':')[0]}: {min(start + BATCH, tasks):,} of {tasks:,} tasks enqueued")
        worker = WorkerId.parse("bench")
        for claimed in store.claim(worker, LeaseDuration(timedelta(seconds=30)), limit=200):
            store.complete(claimed.lease, claimed.revision, "{}", "1")
        deep = store.get_task(f"task-{int(tasks * 0.9):08}")
    return {
        "task list, first page": "/tasks",
        "task list, a page 90% deep": "/tasks?" + urlencode({"after": page_cursor(deep)}),
        "task list, tenant and state filter": "/tasks?tenant=tenant-2&state=queued",
        "task list, newest first": "/tasks?order=newest",
        "overview": "/",
        "task page": f"/tasks/task-{tasks // 2:08}",
        f"task page, {JOURNAL:,}-entry journal": "/tasks/long-journal",
    }


def timings_ms(client: object, path: str, requests: int) -> list[float]:
    took = []
    for _ in range(requests):
        started = time.perf_counter()
        response = client.get(path)  # type: ignore[attr-defined]
        took.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (path, response.status_code)
    return took


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1]


@retry_on_restart
def measure(kind: str, tasks: int, requests: int) -> list[Row]:
    with fresh_store(kind) as url:
        paths = seed(url, tasks)
        with open_store(url) as store:
            client = create_app(store, token="bench").test_client()
            for path in paths.values():  # warm: connections, prepared statements, templates
                timings_ms(client, path, 2)
            results = {figure: timings_ms(client, path, requests) for figure, path in paths.items()}
    baseline = p95(results["task list, first page"])
    rows = []
    for figure, took in results.items():
        value = p95(took)
        rows.append(
            Row(
                f"{kind}: {figure}",
                f"p50 {statistics.median(took):.1f} ms, p95 {value:.1f} ms",
                f"{value / baseline:.2f}x",
                f"p95 < {TARGET_MS:.0f} ms",
                value < TARGET_MS,
            )
        )
    return rows


def run(quick: bool) -> list[Row]:
    """The rows ``run_all.py`` prints: 2,000 tasks with ``--quick``, else 20,000."""
    tasks, requests = (2_000, 20) if quick else (20_000, 40)
    return [
        Row(f"{row.figure} ({tasks:,} tasks)", row.value, row.ratio, row.target, row.met)
        for kind in ("sqlite", "postgres")
        for row in measure(kind, tasks, requests)
    ]


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--tasks", type=int, default=20_000, help="tasks stored (default 20,000)")
    parser.add_argument("--requests", type=int, default=40, help="requests per figure (default 40)")
    parser.add_argument("--quick", action="store_true", help="2,000 tasks, 20 requests")
    parser.add_argument("--store", choices=("sqlite", "postgres", "both"), default="both")
    args = parser.parse_args()
    tasks, requests = (2_000, 20) if args.quick else (args.tasks, args.requests)
    rows = []
    for kind in ("sqlite", "postgres") if args.store == "both" else (args.store,):
        rows += measure(kind, tasks, requests)
    print_table(f"Dashboard server time, {tasks:,} tasks stored (ratio: to the first page's p95)", rows)


if __name__ == "__main__":
    main()
