"""A poison task in a supervisor pool, on SQLite and PostgreSQL: its step SIGKILLs the
child running it every time, yet it stops after its attempt limit, each of its crashes
costs exactly one child restart, and every healthy task sharing the pool completes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import processes
from tests.support.backends import Backend

from . import poison_app

HEALTHY_TASKS = 40
POOL_SIZE = 2
# Long enough that a healthy task's heartbeat keeps its lease on a loaded machine; each
# poison crash leaves its task leased this long before the next claim.
LEASE_S = 2.0
DEADLINE_S = 120.0


def _unfinished(store: WorkflowStore, task_ids: list[str]) -> list[str]:
    return [t for t in task_ids if store.get_task(t).state is not TaskState.TERMINAL]


def _ledger(path: Path) -> list[tuple[str, str, int]]:
    if not path.exists():
        return []
    return [(step, task, int(pid)) for step, task, pid in map(str.split, path.read_text().splitlines())]


@pytest.mark.timeout(180)
def test_a_poison_task_fails_after_max_attempts_while_every_healthy_task_in_the_pool_completes(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.open()
    ledger = tmp_path / "ledger.txt"
    # Highest priority: the poison is claimed again as soon as each lease runs out, in
    # the middle of the healthy work, not after it.
    store.enqueue(WorkflowTask.new("poison", 1, 0, checkpoint_id="poison", priority=10))
    healthy = [f"h{n:02d}" for n in range(HEALTHY_TASKS)]
    for n, task_id in enumerate(healthy):
        store.enqueue(WorkflowTask.new("healthy", 1, n, checkpoint_id=task_id))

    proc = poison_app.spawn(backend.url, ledger, concurrency=POOL_SIZE, lease_s=LEASE_S)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while (left := _unfinished(store, ["poison", *healthy])) and time.monotonic() < deadline:
            assert proc.poll() is None, "the supervisor itself exited"
            time.sleep(0.2)
        assert left == [], f"not finished within {DEADLINE_S} s: {left}"
        proc.send_signal(signal.SIGTERM)
        stdout, _ = proc.communicate(timeout=60)
    finally:
        processes.kill(proc)
    report = json.loads(stdout.splitlines()[-1])

    max_attempts = poison_app.POISON_MAX_ATTEMPTS
    poisoned = store.get_task("poison")
    assert (poisoned.state, poisoned.outcome) == (TaskState.TERMINAL, TaskOutcome.FAILED)
    assert poisoned.reason == (
        f"claimed {max_attempts + 1} times without progress, over max_attempts={max_attempts}: "
        "a step keeps crashing its worker"
    )
    # The step ran (and killed its child) once per claim but the last, which gave up.
    explosions = [pid for step, task, pid in _ledger(ledger) if step == "explode"]
    assert len(explosions) == len(set(explosions)) == max_attempts
    assert all(task == "poison" for step, task, _ in _ledger(ledger) if step == "explode")
    claims = [e.fencing_token for e in store.history("poison") if e.kind == "claimed"]
    assert claims == list(range(1, max_attempts + 2))
    # Each crash cost one child restart, and nothing else did.
    assert report["restarts"] == max_attempts

    for n, task_id in enumerate(healthy):
        record = store.get_task(task_id)
        assert (record.outcome, record.result) == (TaskOutcome.COMPLETED, n + poison_app.HEALTHY_STEPS)
    lines = _ledger(ledger)
    ran = [task for step, task, _ in lines if step == "work"]
    assert set(ran) == set(healthy) and len(ran) >= HEALTHY_TASKS * poison_app.HEALTHY_STEPS
    # ... and the pool kept doing healthy work while the poison was crashing children.
    crash_lines = [i for i, (step, _, _) in enumerate(lines) if step == "explode"]
    assert any(step == "work" for step, _, _ in lines[crash_lines[0] : crash_lines[-1]])
