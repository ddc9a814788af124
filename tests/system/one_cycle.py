"""The one-shot worker process the approval and cancel apps share: a store of its own,
one ``run_once()``, and the outcome printed as one JSON line for the test to read."""

from __future__ import annotations

import json
from datetime import timedelta

from runifold_sync import LeaseDuration, WorkerId, WorkflowRegistry, WorkflowWorker, open_store
from runifold_sync.model.codec import unstructure


def run_one_cycle(
    url: str, registry: WorkflowRegistry, worker_id: str, lease: timedelta, heartbeat: timedelta
) -> int:
    store = open_store(url)
    worker = WorkflowWorker(store, registry, WorkerId.parse(worker_id), LeaseDuration(lease), heartbeat)
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
        store.close()
    print(json.dumps({"outcome": outcome.kind, **unstructure(outcome)}, default=str), flush=True)
    return 0
