"""Throughput and pickup latency while the store's server connections are killed:
``python benchmarks/backend_kills.py [--rate N] [--every S] [--quick]``.

A supervised pool of 4 (``benchmarks/pool.py``, the library's defaults: 30 s leases)
takes one-step tasks enqueued at a steady rate (50/s by default) through three phases of
one run: a baseline, then a phase in which every ``--every`` seconds (2 by default) all
of the pool's server connections are terminated (``pg_terminate_backend`` of the
backends whose ``application_name`` is the pool's, as a pooler or an operator would),
then a recovery phase without kills. For the tasks enqueued in each phase it prints the
completions per second and the pickup latency (enqueue to the start of the step body)
p50 and p99, and each figure's ratio to the baseline of the same run.

A killed connection should cost a task at most a reconnection: the kill phase's
throughput near the baseline's (ratio about 1.0), and its p99 pickup a small multiple of
the baseline's rather than seconds (a task whose cycle failed waited out its 30 s
lease, and each failed cycle slept the 5 s maximum backoff).
"""

from __future__ import annotations

import statistics
import threading
import time
from urllib.parse import urlencode

import psycopg
from common import Row, arg_parser, fresh_postgres, print_table, progress, running_pool

from runifold_sync import WorkflowTask, open_store
from runifold_sync.errors import StoreUnavailable
from runifold_sync.store import TaskOutcome, TaskState

POOL_APP = "runifold-bench-pool"
PROCESSES = 4


def _with_application_name(url: str, name: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{urlencode({'application_name': name})}"


def _kill_pool_backends(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name = %s",
            (POOL_APP,),
        ).fetchall()
    return len(rows)


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


class Producer:
    """Enqueues a one-step task every 1/rate seconds, its input the wall time of the
    enqueue, and remembers each task's phase."""

    def __init__(self, url: str, rate: float) -> None:
        self._store = open_store(_with_application_name(url, "runifold-bench-producer"))
        self._interval_s = 1.0 / rate
        self.phase = "baseline"
        self.tasks: dict[str, str] = {}  # task id -> phase
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._store.close()

    def _run(self) -> None:
        due = time.monotonic()
        n = 0
        while not self._stop.is_set():
            task_id = f"k{n:06d}"
            task = WorkflowTask.new("bench-latency", 1, f"{time.time():.6f}", checkpoint_id=task_id)
            try:
                self._store.enqueue(task)
            except StoreUnavailable:
                continue  # the producer's own connection is not killed; a restart may be
            self.tasks[task_id] = self.phase
            n += 1
            due += self._interval_s
            self._stop.wait(max(due - time.monotonic(), 0.0))


def _figures(
    url: str, tasks: dict[str, str], phases: list[str]
) -> dict[str, tuple[float, float, float, int]]:
    """Per phase: completions per second (of the phase's tasks, over its span from the
    first enqueue to the last step start), pickup p50 and p99 in ms, and tasks failed."""
    store = open_store(url)
    try:
        by_phase: dict[str, list[tuple[float, float]]] = {phase: [] for phase in phases}
        failed = dict.fromkeys(phases, 0)
        for task_id, phase in tasks.items():
            record = store.get_task(task_id)
            if record.state is not TaskState.TERMINAL or record.outcome is not TaskOutcome.COMPLETED:
                failed[phase] += 1
                history = ", ".join(f"{e.kind} by {e.worker_id}" for e in store.history(task_id))
                progress(f"{task_id} ({phase}) not completed: {record.state.value}; {history}")
                continue
            enqueued = float(record.input)
            by_phase[phase].append((enqueued, float(record.result)))
            history = store.history(task_id)
            if sum(e.kind == "claimed" for e in history) > 1:
                events = ", ".join(f"{e.kind} by {e.worker_id} at {e.at:%H:%M:%S.%f}" for e in history)
                progress(f"{task_id} ({phase}) claimed again: {events}")
    finally:
        store.close()
    figures = {}
    for phase, pairs in by_phase.items():
        span = max(started for _, started in pairs) - min(enqueued for enqueued, _ in pairs)
        pickups = [(started - enqueued) * 1000 for enqueued, started in pairs]
        figures[phase] = (
            len(pairs) / span,
            statistics.median(pickups),
            _percentile(pickups, 0.99),
            failed[phase],
        )
    return figures


def run(quick: bool, rate: float = 50.0, every: float = 2.0, phase_s: float | None = None) -> list[Row]:
    """The three phases' figures as rows, ratios to the baseline phase."""
    phase_s = phase_s or (10.0 if quick else 30.0)
    phases = ["baseline", "kills", "recovery"]
    with fresh_postgres() as url:
        open_store(url).close()  # migrated before the pool starts
        kills = 0
        with running_pool(_with_application_name(url, POOL_APP), PROCESSES):
            time.sleep(2.0)  # every worker up and idle
            producer = Producer(url, rate)
            producer.start()
            try:
                for phase in phases:
                    progress(f"backend kills: {phase}, {phase_s:.0f} s at {rate:.0f} tasks/s")
                    producer.phase = phase
                    ends = time.monotonic() + phase_s
                    while time.monotonic() < ends:
                        if phase == "kills":
                            time.sleep(min(every, max(ends - time.monotonic(), 0.0)))
                            kills += _kill_pool_backends(url)
                        else:
                            time.sleep(0.1)
            finally:
                producer.stop()
            # Every task ends within a lease (30 s) and a little: one whose claim was lost
            # with its connection is claimed again once that lease has run out.
            deadline = time.monotonic() + 45
            store = open_store(url)
            try:
                while time.monotonic() < deadline and any(
                    store.get_task(t).state is not TaskState.TERMINAL for t in producer.tasks
                ):
                    time.sleep(0.5)
            finally:
                store.close()
        figures = _figures(url, producer.tasks, phases)
    base_rate, base_p50, base_p99, _ = figures["baseline"]
    rows = []
    for phase in phases:
        completed_s, p50, p99, failed = figures[phase]
        measured = phase != "baseline"
        label = f"backend kills every {every:g} s, {phase}"
        killed = f" ({kills} connections killed)" if phase == "kills" else ""
        rows.append(
            Row(
                f"{label}: completions/s{killed}",
                f"{completed_s:.1f}",
                f"{completed_s / base_rate:.2f}x",
                ">= 0.9x" if measured else "",
                completed_s / base_rate >= 0.9 if measured else None,
            )
        )
        rows.append(Row(f"{label}: pickup p50", f"{p50:.1f} ms", f"{p50 / base_p50:.2f}x"))
        rows.append(
            Row(
                f"{label}: pickup p99",
                f"{p99:.1f} ms",
                f"{p99 / base_p99:.2f}x",
                "< 1000 ms" if measured else "",
                p99 < 1000 if measured else None,
            )
        )
        rows.append(Row(f"{label}: tasks not completed within 45 s", str(failed), "", "0", failed == 0))
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="10 s phases")
    parser.add_argument("--rate", type=float, default=50.0, help="tasks enqueued per second")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between kills")
    parser.add_argument("--phase-s", type=float, default=None, help="seconds each phase lasts")
    args = parser.parse_args()
    rows = run(args.quick, args.rate, args.every, args.phase_s)
    print_table(
        f"pg_terminate_backend of a pool of {PROCESSES}'s connections, {args.rate:g} tasks/s "
        "(ratios: the baseline phase of the same run)",
        rows,
    )


if __name__ == "__main__":
    main()
