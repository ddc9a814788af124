"""The processes of the flow-control contract tests (``tests/store/test_flow_pools.py``):
claimers that hold their leases a while, and enqueuers that race debounced enqueues
against them. Defined here, not in the test module, so a child imports only the package
(see ``spawned``)."""

from __future__ import annotations

import random
import time
from datetime import timedelta
from typing import Any

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask, open_store
from runifold_sync.model.codec import to_json


def hold_and_complete(url: str, name: str, hold_s: float, patience_s: float, go: Any, results: Any) -> None:
    """Claim batches of 1-4 tasks, hold each lease up to ``hold_s`` and complete it, until
    no claim has found work for ``patience_s``; report what it completed and every error."""
    report: dict[str, Any] = {"name": name, "completed": [], "inputs": {}, "errors": []}
    rng = random.Random(name)
    store = open_store(url)
    worker, lease = WorkerId.parse(name), LeaseDuration(timedelta(seconds=60))
    go.wait()
    idle_since = time.monotonic()
    try:
        while time.monotonic() - idle_since < patience_s and len(report["errors"]) < 20:
            try:
                batch = store.claim(worker, lease, limit=rng.randint(1, 4))
            except Exception as exc:
                report["errors"].append(f"claim: {exc!r}")
                continue
            if not batch:
                time.sleep(0.01)
                continue
            idle_since = time.monotonic()
            for claimed in batch:
                time.sleep(hold_s * rng.random())
                task_id = claimed.lease.task_id
                try:
                    store.complete(claimed.lease, claimed.revision, to_json({}), to_json(name))
                    report["completed"].append(task_id)
                    report["inputs"][task_id] = claimed.input_json
                except Exception as exc:
                    report["errors"].append(f"complete {task_id}: {exc!r}")
    finally:
        store.close()
        results.put(report)


def keyed_enqueuer(
    url: str, name: str, mode: str, keys: list[str], count: int, window_s: float, go: Any, results: Any
) -> None:
    """Enqueue ``count`` tasks, each on a random one of ``keys``, debounced (``mode``
    "debounce", window ``window_s``) or as singletons ("singleton"), with an input naming
    this process and its sequence number; report which task each one went to."""
    report: dict[str, Any] = {"name": name, "enqueued": [], "errors": []}
    rng = random.Random(name)
    store = open_store(url)
    go.wait()
    try:
        for seq in range(count):
            key = rng.choice(keys)
            task = WorkflowTask.new(
                "orders",
                1,
                {"by": name, "seq": seq, "key": key},
                **(
                    {"debounce": timedelta(seconds=window_s), "debounce_key": key}
                    if mode == "debounce"
                    else {"dedup_key": key, "singleton": True}
                ),
            )
            try:
                result = store.enqueue(task)
                report["enqueued"].append((key, seq, result.task_id))
            except Exception as exc:
                report["errors"].append(f"enqueue {seq}: {exc!r}")
            time.sleep(rng.random() * window_s / 2)
    finally:
        store.close()
        results.put(report)
