"""A pool whose supervisor is SIGKILLed leaves no orphan working: each child learns of its
parent's death at once (the kernel's parent-death signal), takes no new task, hands its
running task back at the task's next step boundary (released, not counted as an attempt,
the step it was in committed first), marks itself stopped and exits, quietly: no crash
and no traceback in the log. On both stores; a second pool then finishes every task and
no step ever ran twice.

Before, a child ran its long task on unsupervised, heartbeating its lease, and its next
report to the dead parent raised BrokenPipeError: "crashed", a traceback, exit 70."""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.store import TaskState
from tests.support import processes
from tests.support.backends import Backend

from . import pool_app

STEP_S = 1.5  # each of the five steps: a task takes 7.5 s, so the kill lands mid-task
LEASE_S = 30.0  # far longer than the test waits: no lease runs out on its own
TASKS = 6


def _gone(pid: int) -> bool:
    """Exited (a zombie left for a parent that never reaps it counts as exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _enqueue(store: WorkflowStore) -> list[str]:
    ids = [f"o{n}" for n in range(TASKS)]
    for n, task_id in enumerate(ids):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    return ids


@pytest.mark.timeout(180)
def test_children_of_a_killed_supervisor_hand_back_their_tasks_at_the_next_boundary_and_exit_quietly(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = tmp_path / "ledger.txt"
    monkeypatch.setenv("POOL_LEDGER", str(ledger))
    monkeypatch.setenv("POOL_STEP_SECONDS", str(STEP_S))
    store = backend.open()
    ids = _enqueue(store)
    err = tmp_path / "pool.err"
    with processes.reaped() as started:
        with err.open("w") as stderr:
            supervisor = pool_app.spawn(
                backend.url, lease_s=LEASE_S, grace_s=10.0, concurrency=2, stderr=stderr
            )
        started.append(supervisor)
        processes.wait_until(
            lambda: len({line.pid for line in pool_app.read_ledger(ledger)}) == 2,
            60,
            "both children in a step",
        )
        children = {line.pid for line in pool_app.read_ledger(ledger)}
        running = {t for t in ids if store.get_task(t).state is TaskState.LEASED}
        assert len(running) == 2

        killed_at = time.monotonic()
        os.kill(supervisor.pid, signal.SIGKILL)  # the supervisor alone, not its group
        supervisor.wait()
        processes.wait_until(lambda: all(_gone(pid) for pid in children), 30, "the orphaned children to exit")
        exited_s = time.monotonic() - killed_at

    print(f"children of the killed supervisor exited {exited_s:.2f} s after the kill (steps of {STEP_S} s)")
    # At the next boundary, not at the end of a 7.5 s task.
    assert exited_s < 2 * STEP_S + 3.0
    log = err.read_text()
    assert "crashed" not in log and "Traceback" not in log, log
    assert log.count("is gone: handing back its task at the next step boundary and stopping") == 2, log

    # Nothing is left leased: the two running tasks were released by their workers, with
    # the reason, and the claim they lost is not counted as an attempt.
    assert all(store.get_task(t).state is not TaskState.LEASED for t in ids)
    for task_id in running:
        record = store.get_task(task_id)
        assert record.state is TaskState.QUEUED and record.claims_since_progress == 0
        released = [e for e in store.history(task_id) if e.kind == "released"]
        assert len(released) == 1 and "the supervisor (pid" in released[0].detail["reason"]
        assert "is gone; handed back unfinished" in released[0].detail["reason"]
    assert not any(e.kind == "claimed" for t in ids if t not in running for e in store.history(t))
    assert all(w.stopped_at is not None for w in store.workers())

    # A new pool finishes everything; the step in flight at the kill was committed before
    # the hand-back, so no step ran twice.
    monkeypatch.setenv("POOL_STEP_SECONDS", "0")
    with processes.reaped() as started:
        second = pool_app.spawn(backend.url, lease_s=LEASE_S, grace_s=10.0, concurrency=2, base_id="next")
        started.append(second)
        processes.wait_until(
            lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in ids), 60, "every task done"
        )
        second.send_signal(signal.SIGTERM)
        out, _ = second.communicate(timeout=30)
    assert json.loads(out)["restarts"] == 0
    assert [store.get_task(t).result for t in ids] == [n + pool_app.STEPS for n in range(TASKS)]
    runs = Counter((line.task_id, line.call_id) for line in pool_app.read_ledger(ledger))
    assert set(runs.values()) == {1} and len(runs) == TASKS * pool_app.STEPS
