"""A worker's cycles leave no reference cycles behind: each claim's objects (its run, ctx,
checkpoint, commits) are freed by reference counting as the claim ends. Garbage that
only the cyclic collector can free made every few hundred tasks pay for a collection, and
the oldest generation's full scans with it (a tenth of a one-step task's CPU, measured
before the run stopped holding its own ctx)."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from runifold_sync import (
    CancellationToken,
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
)
from runifold_sync.outcomes import RunOutcome

flow = Workflow("acyclic", 1)


@flow.step()
def add(ctx: StepContext, value: int, more: int) -> int:
    return value + more


@flow.effect(idempotent=True)
def record(ctx: StepContext, value: int) -> int:
    return value


@flow.main
def main(ctx: WorkflowContext, value: int) -> int:
    for more in range(3):
        value = add(ctx, value, more)
    ctx.sleep(timedelta(milliseconds=1))  # a suspend, and a second claim that replays the steps
    branches = ctx.parallel({"a": lambda b: add(b, value, 1), "b": lambda b: add(b, value, 2)}, max_threads=1)
    return record(ctx, branches["a"] + branches["b"])


@pytest.fixture
def worker_of(store: WorkflowStore) -> Iterator[Callable[[int], WorkflowWorker]]:
    workers: list[WorkflowWorker] = []

    def make(claim_batch: int) -> WorkflowWorker:
        registry = WorkflowRegistry()
        registry.register(WorkflowDefinition(flow))
        lease = LeaseDuration(timedelta(seconds=30))
        worker = WorkflowWorker(
            store, registry, WorkerId.parse("acyclic"), lease, timedelta(seconds=10), claim_batch=claim_batch
        )
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


def _cyclic_garbage(run: Callable[[], object], ours: WorkflowWorker) -> Counter[str]:
    """The objects that ``run`` left for the cyclic collector, counted by type, less the
    graph of any other worker found there: one an earlier test in this process left
    behind becomes garbage whenever its last thread ends, which may be during ``run``."""
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        run()
        gc.collect()
        found = {id(item): item for item in gc.garbage}
        foreign = [w for w in gc.garbage if isinstance(w, WorkflowWorker) and w is not ours]
        reached: set[int] = set()
        while foreign:
            item = foreign.pop()
            if id(item) in reached:
                continue
            reached.add(id(item))
            foreign.extend(ref for ref in gc.get_referents(item) if id(ref) in found)
        return Counter(type(item).__qualname__ for key, item in found.items() if key not in reached)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("claim_batch", [1, 10])
def test_tasks_run_by_a_worker_leave_no_reference_cycles(
    store: WorkflowStore, worker_of: Callable[[int], WorkflowWorker], claim_batch: int
) -> None:
    worker = worker_of(claim_batch)
    outcomes: Counter[str] = Counter()

    def run(tasks: int) -> None:
        """Run ``tasks`` new tasks to completion (each sleeps once: two cycles)."""
        done = CancellationToken()

        def heard(outcome: RunOutcome) -> None:
            outcomes[outcome.kind] += 1
            if outcomes["completed"] == tasks:
                done.cancel()

        store.enqueue_many([WorkflowTask.new("acyclic", 1, value) for value in range(tasks)])
        outcomes.clear()
        worker.run(done, on_outcome=heard)

    run(1)  # connections, statements and caches are made once
    tasks = 12

    garbage = _cyclic_garbage(lambda: run(tasks), worker)

    assert outcomes["completed"] == tasks and outcomes["suspended"] == tasks, outcomes
    assert garbage == Counter()
