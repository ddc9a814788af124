"""The functions the tests run in processes of their own, and the multiprocessing context
that starts them (:func:`context`). A child imports the module its target is defined
in; a test module brings pytest, hypothesis and the fixtures with it, this one only the
package."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import random
import time
from datetime import timedelta
from typing import Any

from runifold_sync import LeaseDuration, WorkerId, open_store
from runifold_sync.errors import LeaseLostError
from runifold_sync.model.codec import to_json


def context() -> multiprocessing.context.BaseContext:
    """multiprocessing's "forkserver": its server process imports this module, the
    package and psycopg once, and each child is forked from it. A child so starts with
    no connection, pool or thread, as a spawned one would (the server holds none), without
    spending half a second of CPU on the interpreter's start and the imports."""
    forkserver = multiprocessing.get_context("forkserver")
    forkserver.set_forkserver_preload(["tests.support.spawned", "runifold_sync.store.postgres.store"])
    return forkserver


def open_and_migrate(url: str, barrier: Any, results: Any) -> None:
    """In a process of its own: open a store on ``url`` (which migrates it) the moment every
    other process is ready too, migrate once more, and report the versions or the error."""
    try:
        barrier.wait(timeout=60)
        with open_store(url) as store:
            results.put(("migrated", store.migrate()))
    except Exception as exc:
        results.put(("error", repr(exc)))


IDLE_CLAIMS_BEFORE_EXIT = 5
MAX_ERRORS = 20  # a claimer that keeps failing stops and reports instead of spinning


def claimer(url: str, name: str, lease_s: float, stall_every: int, go: Any, results: Any) -> None:
    """Claim batches of 1-5 tasks and complete them until the queue stays empty; report
    every claim, every completion, every refused late write and every other error."""
    report: dict[str, Any] = {"name": name, "claims": [], "completed": [], "refused": [], "errors": []}
    rng = random.Random(name)
    try:
        store = open_store(url)
    except Exception as exc:
        report["errors"].append(f"open: {exc!r}")
        results.put(report)
        return
    worker, lease = WorkerId.parse(name), LeaseDuration(timedelta(seconds=lease_s))
    go.wait()
    idle = 0
    try:
        while idle < IDLE_CLAIMS_BEFORE_EXIT and len(report["errors"]) < MAX_ERRORS:
            try:
                batch = store.claim(worker, lease, limit=rng.randint(1, 5))
            except Exception as exc:
                report["errors"].append(f"claim: {exc!r}")
                continue
            if not batch:
                idle += 1
                time.sleep(0.02 + lease_s * 0.5 * (stall_every > 0))
                continue
            idle = 0
            for claimed in batch:
                task_id, token = claimed.lease.task_id, claimed.lease.fencing_token
                report["claims"].append((task_id, token))
                if stall_every and rng.randrange(stall_every) == 0:
                    time.sleep(lease_s * 1.5)  # outlive the lease: another claimer may take over
                try:
                    store.complete(claimed.lease, claimed.revision, to_json({}), to_json([name, token]))
                    report["completed"].append((task_id, token))
                except LeaseLostError:
                    report["refused"].append((task_id, token))
                except Exception as exc:
                    report["errors"].append(f"complete {task_id}: {exc!r}")
    finally:
        store.close()
        results.put(report)
