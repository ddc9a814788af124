"""The crash points of held completions (``batch.py``): a worker process
running a claim batch of three one-step tasks (``tests.system.held_app``) killed
(SIGKILL) while a completion is held and around the batch's one commit, on every
backend, then the tasks finished by a worker in this process. The ledger says which
bodies ran again:

- killed with a completion held, or just before the commit, every task whose body ran
  runs it again (nothing of theirs was stored: a crash between a last step and its
  completion, as without holding), and a task that had not begun runs once;
- killed just after the commit, every task is complete and no body runs again;
- the same when the heartbeat thread makes that commit, for the completions held before a
  body that runs past a beat: the slow body, killed in flight, runs again.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import attrs
import pytest

from runifold_sync import WorkerId, WorkflowTask, WorkflowWorker
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import ledger, processes
from tests.support.backends import Backend

from . import crash_app, held_app

TASKS = ("h0", "h1", "h2")


@attrs.frozen
class HeldCase:
    crash: str  # RUNIFOLD_CRASH_AT of the process
    states: tuple[TaskState, ...]  # of TASKS after the crash
    ran_twice: tuple[str, ...]  # tasks whose body ran twice in all; the others ran once
    slow: str | None = None  # held_app --slow: the heartbeat thread commits what is held before it


LEASED, TERMINAL = TaskState.LEASED, TaskState.TERMINAL
HELD_CASES = {
    "completion_held": HeldCase("completion_held:h0", (LEASED,) * 3, ("h0",)),
    "before_complete_batch": HeldCase("before_transition:complete_batch", (LEASED,) * 3, TASKS),
    "after_complete_batch": HeldCase("after_transition:complete_batch", (TERMINAL,) * 3, ()),
    "before_complete_batch_by_heartbeat": HeldCase(
        "before_transition:complete_batch", (LEASED,) * 3, ("h0", "h1"), slow="h1"
    ),
    "after_complete_batch_by_heartbeat": HeldCase(
        "after_transition:complete_batch", (TERMINAL, LEASED, LEASED), ("h1",), slow="h1"
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(HELD_CASES))
def test_held_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = HELD_CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    for n, task_id in enumerate(TASKS):
        store.enqueue(WorkflowTask.new("one", 1, n, checkpoint_id=task_id, priority=len(TASKS) - n))

    env = dict(os.environ, RUNIFOLD_CRASH_AT=case.crash)
    args = ["--url", backend.url, "--ledger", str(ledger_path), *(f"--task={t}" for t in TASKS)]
    if case.slow is not None:
        args += ["--slow", case.slow]
    proc = processes.run("tests.system.held_app", *args, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    point, _, subject = case.crash.partition(":")
    assert f"runifold crash point {point}:{subject}" in proc.stderr, proc.stderr
    assert proc.stdout == ""  # nothing was reported complete before it was stored
    assert tuple(store.get_task(t).state for t in TASKS) == case.states
    store.set_clock_offset(crash_app.LEASE.value * 3)  # past the dead worker's leases

    worker = WorkflowWorker(
        store, held_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        for task_id in TASKS:
            crash_app.drive(worker, task_id)
    finally:
        worker.close()
    for n, task_id in enumerate(TASKS):
        record = store.get_task(task_id)
        assert (record.state, record.outcome, record.result) == (TERMINAL, TaskOutcome.COMPLETED, n + 1)
    runs = Counter(line[1] for line in ledger.read(ledger_path))
    assert runs == {t: 2 if t in case.ran_twice else 1 for t in TASKS}
