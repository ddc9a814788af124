"""The crash-point cases of child workflows: worker processes running a parent and its
child (``tests.system.child_app``) killed (SIGKILL) at the writes a child adds, on
every backend, then the rest run by a worker in this process. The ledger says which
bodies ran again:

- a crash after the child was enqueued and before the parent committed the handle (its
  suspend) leaves a queued child and a parent journal without it: the replay enqueues
  the same child id again, which finds the task it made, so one child runs, once;
- a crash of the child before its completion runs its step again (its result rides the
  completion); after it, the child is complete and its parent woken, both in that one
  transaction, so no crash can leave a parent asleep for a child that ended;
- a crash of the woken parent before its own completion runs only its last step again.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from runifold_sync import WorkerId, WorkflowStore, WorkflowTask, WorkflowWorker
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import ledger, processes
from tests.support.backends import Backend
from tests.support.journals import entries

from . import child_app, crash_app

PARENT = "p1"
CHILD = "p1:child:kid-1"
PREPARED, STARTED, WAITING = "prepare#1:done", "child:kid#1:done", "children#1:pending"


@attrs.frozen
class ChildCase:
    crash: tuple[str, ...]  # RUNIFOLD_CRASH_AT of each process, run one after the other
    parent_journal: tuple[str, ...]  # "call id:status" of the parent after the crashes
    parent_state: TaskState
    child_state: TaskState
    ran_twice: tuple[str, ...] = ()  # bodies that ran twice in all; the others ran once
    parent_woken: bool = False  # the parent is due now (its child's end woke it)


CHILD_CASES = {
    "before_parent_suspend_after_child_enqueued": ChildCase(
        ("before_transition:suspend",), (PREPARED,), TaskState.LEASED, TaskState.QUEUED
    ),
    "after_parent_suspend": ChildCase(
        ("after_transition:suspend",), (PREPARED, STARTED, WAITING), TaskState.WAITING, TaskState.QUEUED
    ),
    "before_child_complete": ChildCase(
        ("before_transition:complete",),
        (PREPARED, STARTED, WAITING),
        TaskState.WAITING,
        TaskState.LEASED,
        ran_twice=("work",),
    ),
    "after_child_complete_wakes_parent": ChildCase(
        ("after_transition:complete",),
        (PREPARED, STARTED, WAITING),
        TaskState.WAITING,
        TaskState.TERMINAL,
        parent_woken=True,
    ),
    "before_woken_parent_complete": ChildCase(
        ("after_transition:complete", "before_transition:complete"),
        (PREPARED, STARTED, WAITING),  # the wait's end rides the completion, as finish does
        TaskState.LEASED,
        TaskState.TERMINAL,
        ran_twice=("finish",),
    ),
}


def _crash(backend: Backend, ledger_path: Path, spec: str) -> None:
    env = dict(os.environ, RUNIFOLD_CRASH_AT=spec)
    args = ["--url", backend.url, "--ledger", str(ledger_path), "--task", PARENT]
    proc = processes.run("tests.system.child_app", *args, env=env, timeout_s=60)
    point = spec.partition(":")[0]
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {point}:" in proc.stderr, proc.stderr


def _journal(store: WorkflowStore, task_id: str) -> tuple[str, ...]:
    return tuple(f"{e['call_id']}:{e['status']}" for e in entries(store, task_id))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CHILD_CASES))
def test_child_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CHILD_CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    store.enqueue(WorkflowTask.new("family", 1, "order-1", checkpoint_id=PARENT))

    offset = timedelta(0)
    for spec in case.crash:
        _crash(backend, ledger_path, spec)
        parent = store.get_task(PARENT)
        if case.parent_woken:  # checked before the clock moves: woken means due by now
            assert parent.ready_at is not None and parent.ready_at <= store.now()
        offset += crash_app.LEASE.value * 3  # past the dead worker's lease
        store.set_clock_offset(offset)
    assert _journal(store, PARENT) == case.parent_journal
    assert (store.get_task(PARENT).state, store.get_task(CHILD).state) == (
        case.parent_state,
        case.child_state,
    )

    worker = WorkflowWorker(
        store, child_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        crash_app.drive(worker, PARENT)
    finally:
        worker.close()
    record = store.get_task(PARENT)
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED), record.reason
    assert record.result == "finished after worked on prepared order-1"
    assert [c.task_id for c in store.list_tasks(parent=PARENT)] == [CHILD]  # one child in all
    assert [e.kind for e in store.history(CHILD)].count("enqueued") == 1
    runs = Counter(line[0] for line in ledger.read(ledger_path))
    assert runs == {body: 2 if body in case.ran_twice else 1 for body in child_app.BODIES}
