"""The worker factory of the in-process worker tests: ``make_worker(*definitions)``
gives a worker on ``sqlite_store`` (closed at teardown) with a 30 s lease and a
heartbeat a third of it, unless the test says otherwise."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowWorker,
)
from runifold_sync.outcomes import RunOutcome
from runifold_sync.sqlite import SqliteWorkflowStore

WorkerFactory = Callable[..., WorkflowWorker]


@pytest.fixture
def make_worker(sqlite_store: SqliteWorkflowStore) -> Iterator[WorkerFactory]:
    workers: list[WorkflowWorker] = []

    def make(
        *definitions: WorkflowDefinition,
        registry: WorkflowRegistry | None = None,
        worker_id: str = "w1",
        lease_s: float = 30,
        max_steps_per_claim: int | None = None,
    ) -> WorkflowWorker:
        reg = WorkflowRegistry() if registry is None else registry
        for definition in definitions:
            reg.register(definition)
        worker = WorkflowWorker(
            sqlite_store,
            reg,
            WorkerId.parse(worker_id),
            LeaseDuration(timedelta(seconds=lease_s)),
            timedelta(seconds=lease_s / 3),
            max_steps_per_claim=max_steps_per_claim,
        )
        workers.append(worker)
        return worker

    yield make
    for worker in workers:
        worker.close()


def run_cycle(store: WorkflowStore, *definitions: WorkflowDefinition, worker_id: str = "w") -> RunOutcome:
    """One claim-and-execute cycle on a new worker serving ``definitions``, closed after:
    what a cycle does cannot come from an earlier worker's memory."""
    registry = WorkflowRegistry()
    for definition in definitions:
        registry.register(definition)
    lease = LeaseDuration(timedelta(seconds=30))
    worker = WorkflowWorker(store, registry, WorkerId.parse(worker_id), lease, timedelta(seconds=5))
    try:
        return worker.run_once()
    finally:
        worker.close()
