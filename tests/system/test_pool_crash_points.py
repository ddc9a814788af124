"""The crash points of a pool's hand-back of a dead worker's leases
(``supervisor.hand_back_dead_worker``, the ``hand_back_dead`` transition), on every
backend: a process doing what a pool's new child does first (``hand_back_app``) is
killed (SIGKILL) just before and just after the write that expires the dead worker's
leases, then the tasks are finished by a worker in this process.

- killed before it, nothing was handed back: the tasks stay leased to the dead worker
  (claimable once the lease runs out, as without a supervisor), and a hand-back made
  afterwards (the next child's) still takes them, at once;
- killed after it, the tasks are claimable at once, their history says so once, and the
  next child finds nothing left to hand back.

Either way the matrix workflow then completes with every body run once: the dead worker
ran none, and the hand-back runs none.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask, WorkflowWorker
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import processes
from tests.support.backends import Backend

from . import crash_app

TASKS = ("t1", "t2")  # claimed together by the dead worker: its running task and one claimed ahead
DEAD = WorkerId.parse("pool-0")
DEAD_PID = 999_999  # no process: the dead worker is a claim made here, never run
# Long enough that the dead worker's leases hold for the whole test unless handed back.
LONG_LEASE = LeaseDuration(timedelta(minutes=10))


@attrs.frozen
class PoolCase:
    crash: str  # RUNIFOLD_CRASH_AT of the hand-back process
    handed_back: bool  # the tasks were handed back when it died


POOL_CASES = {
    "before_hand_back_dead": PoolCase("before_transition:hand_back_dead", handed_back=False),
    "after_hand_back_dead": PoolCase("after_transition:hand_back_dead", handed_back=True),
}


def _hand_back(backend: Backend, crash: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ) | ({"RUNIFOLD_CRASH_AT": crash} if crash else {})
    args = ["--url", backend.url, "--worker-id", DEAD.value, "--pid", str(DEAD_PID)]
    return processes.run("tests.system.hand_back_app", *args, env=env, timeout_s=60)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(POOL_CASES))
def test_pool_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = POOL_CASES[name]
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(tmp_path / "ledger.txt"))
    store = backend.open()
    for task_id in TASKS:
        store.enqueue(WorkflowTask.new("crashy", 1, "order-1", checkpoint_id=task_id))
        store.send_signal(task_id, "go", {"ok": True}, signal_id="s1", sender="test")
    assert len(store.claim(DEAD, LONG_LEASE, limit=2)) == 2

    proc = _hand_back(backend, case.crash)
    point, _, subject = case.crash.partition(":")
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {point}:{subject}" in proc.stderr, proc.stderr

    handed = [[e for e in store.history(t) if e.kind == "handed_back"] for t in TASKS]
    assert [len(events) for events in handed] == [int(case.handed_back)] * len(TASKS)
    assert all(store.get_task(t).state is TaskState.LEASED for t in TASKS)
    assert [lease.task_id for lease in store.leases_held_by(DEAD)] == (
        [] if case.handed_back else list(TASKS)
    )

    # The next child's hand-back: what the crashed one did not write, it writes now.
    again = _hand_back(backend, None)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split() == ([] if case.handed_back else list(TASKS))
    assert store.leases_held_by(DEAD) == []

    # Claimable at once: no store time moved, the ten-minute leases notwithstanding.
    worker = WorkflowWorker(
        store, crash_app.registry(), WorkerId.parse("pool-0.1"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        for task_id in TASKS:
            crash_app.drive(worker, task_id)
    finally:
        worker.close()
    for task_id in TASKS:
        record = store.get_task(task_id)
        assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED), record.reason
        assert record.result == {
            "charge": f"ch-{task_id}/charge#1",
            "shipment": f"shipped {task_id}/ship#1",
            "approval": {"ok": True},
            "end": "done",
        }
        assert sum(e.kind == "handed_back" for e in store.history(task_id)) == 1
        reclaim = [e for e in store.history(task_id) if e.kind == "claimed"][1]
        assert reclaim.detail == {"from_state": "leased", "expired_owner": "pool-0"}
    runs = Counter((line[0], line[1]) for line in crash_app.ledger_lines())
    assert runs == {(body, t): 1 for body in crash_app.BODIES for t in TASKS}
