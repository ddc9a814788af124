"""Idle outcomes (claims that found nothing) per completed task on PostgreSQL, with a
steady trickle of one-step tasks (one ``enqueue`` each) to idle workers: W worker
processes each loop ``run_once`` and, when idle, wait as a worker does
(``IdleWait``). Two ways in the same run, each on a fresh database: every waiter a
notification wakes claims (before wake slots: the baseline) and wake slots (about as
many waiters claim as the notification announces tasks). Shown for each: idle outcomes
per completion, the pickup latency (store time from a task's enqueue to its claim,
median and 95th percentile: the cost of the grace a slot's loser waits) and the
workers' CPU per task.
``python benchmarks/idle_wakeups.py [--quick] [--workers W] [--rate R]``.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections import Counter
from datetime import timedelta

from common import Row, arg_parser, fresh_store, print_table, progress, rate, registry, retry_on_restart

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask, WorkflowWorker, open_store
from runifold_sync.model.cancellation import CancellationToken
from runifold_sync.worker.idle_backoff import DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF, IdleBackoff, IdleWait

WAYS = ("every_waiter", "wake_slots", "slots_claim_when_due")
LABELS = {
    "every_waiter": "every woken waiter claims (before)",
    "wake_slots": "wake slots",
    "slots_claim_when_due": "wake slots, a worker that claims only when told work is due (what-if)",
}


def wait_until_told(store: object, stop: object) -> None:
    """The what-if idle wait: block in ``wait_for_work`` slices until it says work is due,
    never claiming because a backoff ran out (``IdleWait`` claims at every backoff's end,
    an idle outcome whenever nothing came)."""
    while not stop.is_set() and not store.wait_for_work(timedelta(seconds=0.5)):  # type: ignore[attr-defined]
        pass


def worker_main(url: str, n: int, way: str, stop: object, results: object) -> None:
    """One worker process: run until ``stop`` is set, then report its outcome counts."""
    store = open_store(url)
    store.dialect.wake_slots = way != "every_waiter"  # type: ignore[attr-defined]  # PostgreSQL's
    worker = WorkflowWorker(
        store,
        registry(),
        WorkerId.parse(f"idle-{n}"),
        LeaseDuration(timedelta(minutes=1)),
        timedelta(seconds=20),
    )
    counts: Counter[str] = Counter()
    inner = store.wait_for_work

    def counted(timeout: timedelta, routes: object = None) -> bool:
        woke = inner(timeout, routes)  # type: ignore[arg-type]
        counts[f"wait_{'look' if timeout <= timedelta(0) else 'block'}_{woke}"] += 1
        return woke

    store.wait_for_work = counted  # type: ignore[method-assign]
    idle = IdleWait(store, IdleBackoff(DEFAULT_MIN_BACKOFF, DEFAULT_MAX_BACKOFF))
    token = CancellationToken()
    cpu = time.process_time()
    try:
        while not stop.is_set():  # type: ignore[attr-defined]
            outcome = worker.run_once()
            counts[outcome.kind] += 1
            if outcome.kind == "idle" and way == "slots_claim_when_due":
                wait_until_told(store, stop)
            elif outcome.kind == "idle":
                idle.wait(token)
            else:
                idle.worked()
    finally:
        worker.close()
        store.close()
    counts["cpu_us"] = int((time.process_time() - cpu) * 1e6)
    results.put(dict(counts))  # type: ignore[attr-defined]


@retry_on_restart
def measure(way: str, workers: int, per_s: float, seconds: float) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    with fresh_store("postgres") as url:
        open_store(url).close()  # migrated before the workers start
        stop, results = context.Event(), context.Queue()
        procs = [
            context.Process(target=worker_main, args=(url, n, way, stop, results)) for n in range(workers)
        ]
        for proc in procs:
            proc.start()
        with open_store(url) as store:
            time.sleep(3.0)  # every worker up and idle
            count = int(per_s * seconds)
            progress(f"idle wake-ups: {way}, {workers} workers, {count} tasks at {per_s:g}/s")
            started = time.monotonic()
            for k in range(count):
                time.sleep(max(0.0, started + k / per_s - time.monotonic()))
                store.enqueue(WorkflowTask.new("bench-flow", 1, 1, checkpoint_id=f"i{k}"))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if all(s.state.value == "terminal" for s in store.queue_stats()):
                    break
                time.sleep(0.1)
            stop.set()
            counts: Counter[str] = Counter()
            for _ in procs:
                counts.update(results.get(timeout=60))
            for proc in procs:
                proc.join(timeout=60)
            pickups = []
            for k in range(count):
                events = {e.kind: e.at for e in store.history(f"i{k}")}
                pickups.append((events["claimed"] - events["enqueued"]).total_seconds() * 1000)
        pickups.sort()
        progress(f"{way}: {dict(counts)}")
        return {
            "completed": counts["completed"],
            "idle": counts["idle"],
            "cpu_us_a_task": counts["cpu_us"] / max(counts["completed"], 1),
            "median_ms": statistics.median(pickups),
            "p95_ms": pickups[int(0.95 * (len(pickups) - 1))],
        }


def run(quick: bool, workers: int = 4, per_s: float = 50.0) -> list[Row]:
    seconds = 4.0 if quick else 30.0
    found = {way: measure(way, workers, per_s, seconds) for way in WAYS}
    rows = []
    base = found["every_waiter"]["idle"] / max(found["every_waiter"]["completed"], 1)
    for way in WAYS:
        m = found[way]
        per_task = m["idle"] / max(m["completed"], 1)
        label = LABELS[way]
        rows.append(
            Row(
                f"PostgreSQL, {workers} workers, {per_s:g} tasks/s: idle outcomes a completion, {label}",
                f"{per_task:.2f} ({m['idle']:,.0f} idle, {m['completed']:,.0f} completed)",
                "baseline" if way == "every_waiter" else f"{per_task / base:.2f}x before" if base else "",
            )
        )
        rows.append(
            Row(
                f"PostgreSQL, {workers} workers, {per_s:g} tasks/s: pickup ms (median, p95), {label}",
                f"{m['median_ms']:.1f}, {m['p95_ms']:.1f}",
            )
        )
        rows.append(
            Row(
                f"PostgreSQL, {workers} workers, {per_s:g} tasks/s: workers' CPU a task, {label}",
                rate(m["cpu_us_a_task"], " µs"),
            )
        )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="4 s of tasks instead of 30 s")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=50.0, help="tasks enqueued a second")
    args = parser.parse_args()
    print_table("Idle wake-ups", run(args.quick, args.workers, args.rate))


if __name__ == "__main__":
    main()
