"""A parent fanning out to 100 children and waiting for them all, in a supervised pool on
each store, while its workers are SIGKILLed: the parent completes with every child's
result, and exactly 100 child tasks exist, each completed once."""

from __future__ import annotations

import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.worker.settings import AUTO_CLAIM_BATCH
from tests.support import ledger, processes
from tests.support.backends import Backend

from . import fanout_app

CHILDREN = 100
KILLS = 3


def _workers(pool_pid: int) -> list[int]:
    """The pool's live worker processes (the supervisor's children)."""
    path = Path(f"/proc/{pool_pid}/task/{pool_pid}/children")
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


@pytest.mark.timeout(180)
def test_a_parent_waits_for_a_hundred_children_through_worker_kills(backend: Backend, tmp_path: Path) -> None:
    store = backend.open()
    ledger_path = tmp_path / "ledger.txt"
    store.enqueue(WorkflowTask.new("fanout", 1, list(range(CHILDREN)), checkpoint_id="fan"))
    env = dict(os.environ, **{fanout_app.LEDGER_ENV: str(ledger_path)})
    args = ["run", "--app", "tests.system.fanout_app:registry", "--database", backend.url]
    args += ["--concurrency", "3", "--lease", "2", "--heartbeat", "0.5"]
    rng = random.Random(20)
    with processes.reaped() as started:
        pool = processes.spawn("runifold_sync", *args, env=env, own_session=True, stdout=None)
        started.append(pool)
        killed = 0
        deadline = time.monotonic() + 150
        while store.get_task("fan").state is not TaskState.TERMINAL:
            assert time.monotonic() < deadline, f"unfinished: {store.get_task('fan')}"
            done = sum(1 for _ in ledger.read(ledger_path))
            workers = _workers(pool.pid)
            if killed < KILLS and done >= (killed + 1) * CHILDREN // (KILLS + 1) and workers:
                os.kill(rng.choice(workers), signal.SIGKILL)
                killed += 1
            time.sleep(0.05)
        assert killed == KILLS
    parent = store.get_task("fan")
    assert (parent.outcome, parent.result) == (TaskOutcome.COMPLETED, 2 * sum(range(CHILDREN))), parent.reason
    children = store.list_tasks(parent="fan", limit=1000)
    assert len(children) == CHILDREN
    assert {c.outcome for c in children} == {TaskOutcome.COMPLETED}
    runs = Counter(line[0] for line in ledger.read(ledger_path))
    assert set(runs) == {c.task_id for c in children}
    # A kill runs again the body it interrupted and those whose completions its worker
    # held for its next claim (claim batches: at most AUTO_CLAIM_BATCH), never one that was
    # committed: at most once per kill for a child, and a claim's worth per kill in all.
    assert max(runs.values()) <= 1 + KILLS
    assert sum(runs.values()) - CHILDREN <= KILLS * (AUTO_CLAIM_BATCH + 1)
