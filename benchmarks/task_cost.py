"""Where a one-step task's CPU goes on PostgreSQL, in layers measured in one run: a raw
single-row UPDATE commit (the least a durable completion can cost), the claim's share
(``store.claim`` of 10 tasks on a worker's routes, per task), the store's completion
alone (``store.complete`` on tasks already claimed: the fenced UPDATE with its history
event, result NOTIFY and parent wake-up), what a worker's loop sends for a batch
(``store.complete_batch`` of ten tasks with the claim of the next ten, one transaction),
and a worker's whole loop with ``claim_batch=10`` (claim, replay, the step, the
checkpoint, the batch's held completions). Client and server CPU of each, per task, and
each layer's ratio to the raw commit; what the loop spends beyond its share of the
batch's transaction is the engine's own work.

``python benchmarks/task_cost.py [--quick]``
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

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
from cpu_per_step import RawCommits, raw_commits

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    WorkerId,
    WorkerSettings,
    WorkflowWorker,
    open_store,
)
from runifold_sync.store.records import ClaimedTask, ClaimRequest, Completion, Routes

LEASE = LeaseDuration(timedelta(minutes=10))
CLAIM_BATCH = 10


@dataclass(frozen=True)
class Cost:
    """CPU per task, in microseconds, of the client process and of the server."""

    client_us: float
    server_us: float

    @property
    def total_us(self) -> float:
        return self.client_us + self.server_us

    def plus(self, other: Cost) -> Cost:
        return Cost(self.client_us + other.client_us, self.server_us + other.server_us)

    def divided(self, n: int) -> Cost:
        return Cost(self.client_us / n, self.server_us / n)


def spent_since(tasks: int, cpu0: float, server0: float | None) -> Cost:
    """This process's CPU and the local server's since ``cpu0`` and ``server0``, per task."""
    server = server_cpu_s()
    if server is None or server0 is None:
        raise RuntimeError("the PostgreSQL server's CPU cannot be read: it is not on this machine")
    return Cost((time.process_time() - cpu0) / tasks * 1e6, (server - server0) / tasks * 1e6)


def claim_and_completion_cost(tasks: int) -> tuple[Cost, Cost, Cost]:
    """``store.claim`` of ``CLAIM_BATCH`` tasks at a time on a worker's routes; then
    ``store.complete`` of each of ``tasks`` claimed tasks; then what a worker's loop sends
    for a batch of one-step tasks: ``store.complete_batch`` of ``CLAIM_BATCH`` tasks with
    the claim of the next ``CLAIM_BATCH`` in the same transaction. The cost per task of
    each, separately."""
    worker_id = WorkerId.parse("cost-0")
    served = [(d.identity.name, d.identity.version, d.identity.fingerprint) for d in registry()]
    routes = Routes.serving(WorkerSettings().queues, served)  # as a worker's claims carry
    with fresh_store("postgres") as url:
        store = open_store(url)
        try:
            enqueue_workflows(store, 2 * tasks + 2 * CLAIM_BATCH, 1, delay=None)
            store.claim(worker_id, LEASE, limit=CLAIM_BATCH, routes=routes)  # warm up
            claimed: list[ClaimedTask] = []
            cpu0, server0 = time.process_time(), server_cpu_s()
            while len(claimed) < tasks:
                claimed += store.claim(worker_id, LEASE, limit=CLAIM_BATCH, routes=routes)
            claim = spent_since(len(claimed), cpu0, server0)
            head = '{"phase": "completed"}'
            cpu0, server0 = time.process_time(), server_cpu_s()
            for task in claimed:
                store.complete(task.lease, task.revision, head, "1")
            completion = spent_since(len(claimed), cpu0, server0)
            batch = store.claim(worker_id, LEASE, limit=CLAIM_BATCH, routes=routes)
            next_claim = ClaimRequest(worker_id, LEASE, CLAIM_BATCH, routes)
            done_tasks = 0
            cpu0, server0 = time.process_time(), server_cpu_s()
            while done_tasks < tasks:
                done = store.complete_batch(
                    [Completion(t.lease, t.revision, head, "1") for t in batch], then_claim=next_claim
                )
                if done.refused:
                    raise RuntimeError(f"completions refused: {done.refused!r}")
                done_tasks += len(batch)
                batch = done.claimed
            return claim, completion, spent_since(done_tasks, cpu0, server0)
        finally:
            store.close()


def cycle_cost(tasks: int) -> Cost:
    """A worker's loop (``run``, its completions held for each batch's one commit) over
    ``tasks`` one-step tasks, as a pool child runs them."""
    with fresh_store("postgres") as url:
        store = open_store(url)
        settings = WorkerSettings(lease_duration=LEASE, claim_batch=CLAIM_BATCH)
        worker = WorkflowWorker(store, registry(), WorkerId.parse("cost-1"), settings=settings)
        try:
            enqueue_workflows(store, tasks + 1, 1, delay=None)
            worker.run_once()  # warm up: connections, prepared statements
            cpu0, server0 = time.process_time(), server_cpu_s()
            report = worker.run(CancellationToken(), max_tasks=tasks)
            if report.outcomes != {"completed": tasks}:
                raise RuntimeError(f"unexpected outcomes {report.outcomes!r}")
            return spent_since(tasks, cpu0, server0)
        finally:
            worker.close()
            store.close()


def _raw(raw: RawCommits) -> Cost:
    assert raw.server_s is not None
    return Cost(raw.cpu_s / raw.commits * 1e6, raw.server_s / raw.commits * 1e6)


def run(quick: bool) -> list[Row]:
    tasks = 1000 if quick else 3000
    # Two interleaved rounds of the three layers, each layer's two samples averaged: the
    # machine's speed drifts by the minute, and the ratios are what is compared.
    raw = claim = completion = batched = cycle = Cost(0.0, 0.0)
    for round_ in (1, 2):
        progress(f"one-step task cost, round {round_} of 2")
        raw = raw.plus(_raw(raw_commits("postgres")))
        claimed, completed, completed_together = claim_and_completion_cost(tasks)
        claim, completion = claim.plus(claimed), completion.plus(completed)
        batched = batched.plus(completed_together)
        cycle = cycle.plus(cycle_cost(tasks))
    raw, claim, completion, batched, cycle = (c.divided(2) for c in (raw, claim, completion, batched, cycle))

    def row(figure: str, cost: Cost, ratio: str) -> Row:
        value = f"{cost.total_us:,.0f} µs ({cost.client_us:,.0f} client + {cost.server_us:,.0f} server)"
        return Row(figure, value, ratio)

    def times_raw(cost: Cost) -> str:
        return (
            f"{cost.total_us / raw.total_us:.2f}x the raw commit "
            f"(client {cost.client_us / raw.client_us:.1f}x, server {cost.server_us / raw.server_us:.1f}x)"
        )

    engine = Cost(cycle.client_us - batched.client_us, cycle.server_us - batched.server_us)

    def share(cost: Cost) -> str:
        return f"{cost.total_us / cycle.total_us:.0%} of the cycle"

    return [
        row("PostgreSQL: raw single-row UPDATE commit", raw, "baseline"),
        row(
            f"PostgreSQL: claim of {CLAIM_BATCH} tasks on a worker's routes, per task",
            claim,
            times_raw(claim),
        ),
        row("PostgreSQL: store.complete of a claimed one-step task", completion, times_raw(completion)),
        row(
            f"PostgreSQL: store.complete_batch of {CLAIM_BATCH} one-step tasks with the claim of the "
            f"next {CLAIM_BATCH}, one transaction, per task",
            batched,
            f"{times_raw(batched)}; {batched.total_us / (claim.total_us + completion.total_us):.2f}x "
            "a claim's share and a completion of its own",
        ),
        row(
            f"PostgreSQL: worker cycle of a one-step task, claim batch {CLAIM_BATCH}", cycle, times_raw(cycle)
        ),
        row("  its share of the batch's completion and next claim", batched, share(batched)),
        row(
            "  the rest: the engine's own work (replay, the step, checkpoint, leases)", engine, share(engine)
        ),
    ]


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print_table("one-step task cost (PostgreSQL, 1 process)", run(args.quick))


if __name__ == "__main__":
    main()
