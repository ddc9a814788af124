"""Many processes claiming from one database: no task is claimed twice under one token,
none is lost, and each is completed exactly once.

Each claimer is a process of its own, forked by multiprocessing's fork server (no
connection, pool or thread crosses the fork: ``tests/support/spawned.py``), that opens
its own store from the URL, claims small batches and completes what it claims. In the
second scenario leases are short and claimers sometimes stall past them, so tasks are
legitimately reclaimed: fencing must then refuse every late write.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Any

import pytest

from runifold_sync import WorkflowStore, WorkflowTask, open_store
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import spawned
from tests.support.backends import Backend, contract_backend
from tests.support.spawned import claimer

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend


def run_claimers(
    url: str, processes: int, lease_s: float = 60.0, stall_every: int = 0
) -> list[dict[str, Any]]:
    context = spawned.context()
    go, results = context.Event(), context.Queue()
    workers = [
        context.Process(target=claimer, args=(url, f"claimer-{n}", lease_s, stall_every, go, results))
        for n in range(processes)
    ]
    for process in workers:
        process.start()
    go.set()
    reports = [results.get(timeout=90) for _ in workers]  # drain before join
    for process in workers:
        process.join(timeout=30)
        assert process.exitcode == 0
    return reports


def seed(url: str, count: int) -> None:
    tasks = [WorkflowTask.new("orders", 1, {"n": n}, checkpoint_id=f"task-{n:05d}") for n in range(count)]
    if url.startswith("sqlite"):  # seeding only: skip the per-commit fsync
        opened: WorkflowStore = SqliteWorkflowStore.open(url.removeprefix("sqlite:///"), synchronous="NORMAL")
    else:
        opened = open_store(url)
    with opened as store:  # seeding only: a few transactions, not one per task
        for start in range(0, count, 500):
            store.enqueue_many(tasks[start : start + 500])


def check_exactly_once(url: str, count: int, reports: list[dict[str, Any]]) -> None:
    errors = [error for report in reports for error in report["errors"]]
    assert errors == [], errors[:5]  # no "database is locked", no StoreUnavailable
    claims = Counter(tuple(c) for report in reports for c in report["claims"])
    assert [key for key, n in claims.items() if n > 1] == [], "a (task, token) was claimed twice"
    completed = Counter(task_id for report in reports for task_id, _ in report["completed"])
    assert [key for key, n in completed.items() if n > 1] == [], "a task was completed twice"
    assert len(completed) == count, f"{count - len(completed)} tasks were never completed"
    assert sum(1 for report in reports if report["completed"]) >= 2, "the claimers did not run concurrently"
    winners = {task_id: [r["name"], token] for r in reports for task_id, token in r["completed"]}
    with open_store(url) as store:
        for task_id in random.Random(0).sample(sorted(winners), 50):
            record = store.get_task(task_id)
            assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
            assert record.result == winners[task_id]  # the completing claimer, under its token
            assert [e.kind for e in store.history(task_id)].count("completed") == 1


@pytest.fixture
def shared_url(backend: Backend) -> str:
    """The database the claiming processes share, on each contract backend."""
    return backend.url


@pytest.mark.timeout(120)
def test_concurrent_claimers_complete_every_task_exactly_once(shared_url: str) -> None:
    processes = 4 if shared_url.startswith("sqlite") else 8
    seed(shared_url, 2000)
    started = time.monotonic()
    reports = run_claimers(shared_url, processes)
    check_exactly_once(shared_url, 2000, reports)
    assert sum(len(r["refused"]) for r in reports) == 0  # leases never expired
    claimed = Counter(task_id for r in reports for task_id, _ in r["claims"])
    assert (len(claimed), sum(claimed.values())) == (2000, 2000)  # each task claimed exactly once
    # Every claimer gets a share: on SQLite, a waiter for the lock must catch the gaps
    # between a busy writer's transactions (SQLite's own busy handler, sleeping up to
    # 100 ms between tries, let one process do nearly all the work).
    shares = sorted(len(r["completed"]) for r in reports)
    assert shares[0] >= 2000 / processes / 10, shares
    assert time.monotonic() - started < 60


@pytest.mark.timeout(120)
def test_claimers_outliving_their_leases_are_fenced_off(shared_url: str) -> None:
    processes = 4 if shared_url.startswith("sqlite") else 8
    seed(shared_url, 300)
    reports = run_claimers(shared_url, processes, lease_s=0.3, stall_every=15)
    check_exactly_once(shared_url, 300, reports)
    refused = [tuple(x) for r in reports for x in r["refused"]]
    assert refused, "no claimer outlived its lease: the scenario did not exercise fencing"
    claims = Counter(task_id for r in reports for task_id, _ in r["claims"])
    assert any(n > 1 for n in claims.values()), "no task was reclaimed after an expired lease"
