"""The crash points of the workflow verbs of issue 48, on both stores: a worker process
(``tests.system.verb_app``) SIGKILLed at each, then a worker in this process
finishing the task; the ledger the bodies write says what ran, and with what.

- ``ctx.now()`` has no write of its own: its record rides the next commit (here the
  commit of the step it was handed to). Killed after that commit, the recovery replays
  the recorded time: the step ran once, the result carries the time it was given.
  Killed before it, both are lost together and the step runs again with a fresh time.
- A step's final failure (``StepFailed``) is committed (``<call id>:failed``) before it is
  raised. Killed before that commit, the recovery runs the failed attempt again (the
  failure was never recorded); after it, the recovery replays the recorded failure and
  the body never runs again. Either way the fallback runs once.
- A step body's ``heartbeat(details)`` commits them (``<call id>:heartbeat``). Killed
  before the first such commit, the recovery's attempt starts from nothing and runs item
  0 again; after it, the attempt reads ``last_heartbeat`` and goes on from item 1.
- A step body's ``set_event`` commits at once (``event:<key>``): unpublished when killed
  before that commit, published after it; the recovery runs the body again (it was not
  recorded), from its last heartbeat (every item done), and publishes it again.
- A step in a ``finally:`` block runs as a cancel unwinds the main function, in the claim
  the cancel reached, but it is not replayed after a crash: a task whose cancel is
  requested is never run again, only compensated. Killed before the cleanup step's body,
  it never runs; a compensation, whose every step is committed, runs whatever the crash
  (and it is given its step's arguments, recorded with the step's commit).
- What fired in a ``ctx.wait_any`` is committed at once (``any#1``; for a signal, in the
  write that consumes it). Killed before that commit, the recovery decides again (the
  signal still pending, the child still ended: the same choice here); after it, it
  replays the choice, and the signal is consumed exactly once.
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
from tests.support.journals import entries

from . import crash_app, verb_app

TASK = "t1"


@attrs.frozen
class Case:
    crash: str
    journal: tuple[str, ...]  # "call id:status" after the crash
    runs: dict[str, int]  # how often each body ran in all
    same_time: bool = True  # the result carries the time the first stamp was given
    items: tuple[str, ...] = ("0", "1", "2", "3")  # the crunch items processed, in order
    published: bool = False  # the crunch body's event is stored right after the crash


NOW, STAMP, FAILED, FELL_BACK = "now#1:done", "stamp#1:done", "doomed#1:failed", "fallback#1:done"
ONCE = {"stamp": 1, "doomed": 1, "fallback": 1}

CASES = {
    "now_before_commit": Case("before_commit:stamp#1", (), ONCE | {"stamp": 2, "crunch": 1}, False),
    "now_after_commit": Case("after_commit:stamp#1", (NOW, STAMP), ONCE | {"crunch": 1}),
    "failed_before_commit": Case(
        "before_commit:doomed#1:failed", (NOW, STAMP), ONCE | {"doomed": 2, "crunch": 1}
    ),
    "failed_after_commit": Case("after_commit:doomed#1:failed", (NOW, STAMP, FAILED), ONCE | {"crunch": 1}),
    "heartbeat_before_commit": Case(
        "before_commit:crunch#1:heartbeat",
        (NOW, STAMP, FAILED, FELL_BACK),
        ONCE | {"crunch": 2},
        items=("0", "0", "1", "2", "3"),
    ),
    "heartbeat_after_commit": Case(
        "after_commit:crunch#1:heartbeat", (NOW, STAMP, FAILED, FELL_BACK), ONCE | {"crunch": 2}
    ),
    "body_event_before_commit": Case(
        "before_commit:event:crunched", (NOW, STAMP, FAILED, FELL_BACK), ONCE | {"crunch": 2}
    ),
    "body_event_after_commit": Case(
        "after_commit:event:crunched", (NOW, STAMP, FAILED, FELL_BACK), ONCE | {"crunch": 2}, published=True
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CASES))
def test_verb_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    store.enqueue(WorkflowTask.new("verbs", 1, "order-1", checkpoint_id=TASK))

    env = dict(os.environ, RUNIFOLD_CRASH_AT=case.crash)
    args = ["--url", backend.url, "--ledger", str(ledger_path), "--task", TASK]
    proc = processes.run("tests.system.verb_app", *args, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert case.crash.split(":")[0] in proc.stderr
    journal = tuple(f"{e['call_id']}:{e['status']}" for e in entries(store, TASK))
    assert journal == case.journal
    first_stamp = ledger.read(ledger_path)[0]
    assert [e.key for e in store.published_events(TASK)] == (["crunched"] if case.published else [])
    store.set_clock_offset(crash_app.LEASE.value * 3)  # past the dead worker's lease

    worker = WorkflowWorker(
        store, verb_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        crash_app.drive(worker, TASK)
    finally:
        worker.close()
    record = store.get_task(TASK)
    assert record.outcome == TaskOutcome.COMPLETED, record.reason
    assert isinstance(record.result, dict)
    assert record.result["plan"] == "backordered after RuntimeError"
    lines = ledger.read(ledger_path)
    assert Counter(line[0] for line in lines if line[0] != "item") == case.runs
    assert tuple(line[3] for line in lines if line[0] == "item") == case.items
    assert store.get_event(TASK, "crunched") == verb_app.CRUNCH_ITEMS
    assert record.result["crunched"] == verb_app.CRUNCH_ITEMS
    stamps = [line[3] for line in lines if line[0] == "stamp"]
    assert stamps[0] == first_stamp[3]
    # The time the workflow returns is the time its (last) stamp was given: replayed when
    # the first was recorded, read afresh when the crash lost it.
    assert record.result["at"] == stamps[-1]
    if case.same_time:
        assert record.result["at"] == first_stamp[3]
    recorded = [e for e in entries(store, TASK) if e["kind"] == "now"]
    assert [e["output"] for e in recorded] == [record.result["at"]]


@attrs.frozen
class CleanupCase:
    crash: str
    journal: tuple[str, ...]  # "call id:status" after the crash
    runs: dict[str, int]  # how often each body ran in all


CLEANUP_CASES = {
    # The step's commit carries the arguments its compensation takes.
    "args_after_commit": CleanupCase("after_commit:hold#1", ("hold#1:done",), {"hold": 1, "unhold": 1}),
    # The finally: step never began: it is lost; the compensation runs all the same.
    "finally_before_step": CleanupCase("before_step:release#1", ("hold#1:done",), {"hold": 1, "unhold": 1}),
    # It ran, uncommitted: not run again (the task is only compensated now).
    "finally_after_step": CleanupCase(
        "after_step:release#1", ("hold#1:done",), {"hold": 1, "release": 1, "unhold": 1}
    ),
    # Committed with the undo's start: the acknowledgement of the cancel is all that is left.
    "finally_before_cancel": CleanupCase(
        "before_transition:cancel", ("hold#1:done", "release#1:done"), {"hold": 1, "release": 1, "unhold": 1}
    ),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(CLEANUP_CASES))
def test_cleanup_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CLEANUP_CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger_path))
    monkeypatch.setenv(verb_app.URL_ENV, backend.url)
    store = backend.open()
    store.enqueue(WorkflowTask.new("cleanup", 1, "room-7", checkpoint_id=TASK))

    env = dict(os.environ, RUNIFOLD_CRASH_AT=case.crash)
    args = ["--url", backend.url, "--ledger", str(ledger_path), "--task", TASK]
    proc = processes.run("tests.system.verb_app", *args, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert case.crash.split(":")[0] in proc.stderr
    journal = tuple(f"{e['call_id']}:{e['status']}" for e in entries(store, TASK))
    assert journal == case.journal
    store.set_clock_offset(crash_app.LEASE.value * 3)  # past the dead worker's lease

    worker = WorkflowWorker(
        store, verb_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        crash_app.drive(worker, TASK)
    finally:
        worker.close()
    record = store.get_task(TASK)
    assert record.state is TaskState.CANCELLED, (record.state, record.reason)
    lines = ledger.read(ledger_path)
    assert Counter(line[0] for line in lines) == case.runs
    assert [line[3] for line in lines if line[0] == "unhold"] == ["room-7"]  # the step's argument


ANY_CASES = {
    # (input, crash, journal after the crash, pending "stop" signals after the crash, fired)
    "signal_before_commit": ("by-signal", "before_commit:any#1", (), 1, 0),
    "signal_after_commit": ("by-signal", "after_commit:any#1", ("child:chore#1", "any#1"), 0, 0),
    "child_before_commit": ("by-child", "before_commit:any#1", ("child:chore#1", "any#1"), 0, 1),
    "child_after_commit": ("by-child", "after_commit:any#1", ("child:chore#1", "any#1"), 0, 1),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(ANY_CASES))
def test_wait_any_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    order, crash, journal_after, pending_after, fired = ANY_CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(crash_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    store.enqueue(WorkflowTask.new("anyone", 1, order, checkpoint_id=TASK))
    if order == "by-signal":
        store.send_signal(TASK, "stop", "enough", signal_id="s1", sender="ops")

    env = dict(os.environ, RUNIFOLD_CRASH_AT=crash)
    args = ["--url", backend.url, "--ledger", str(ledger_path), "--task", TASK]
    proc = processes.run("tests.system.verb_app", *args, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert tuple(e["call_id"] for e in entries(store, TASK)) == journal_after
    assert len(store.pending_signals(TASK)) == pending_after
    store.set_clock_offset(crash_app.LEASE.value * 3)  # past the dead worker's lease

    worker = WorkflowWorker(
        store, verb_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        crash_app.drive(worker, TASK)
    finally:
        worker.close()
    record = store.get_task(TASK)
    assert record.outcome == TaskOutcome.COMPLETED, record.reason
    value = "enough" if fired == 0 else f"chore {order} done"
    assert record.result == {"fired": fired, "value": value}
    assert store.pending_signals(TASK) == []
    consumed = [e for e in store.history(TASK) if e.kind == "signal_consumed"]
    assert len(consumed) == (1 if order == "by-signal" else 0)
    assert [line[0] for line in ledger.read(ledger_path)] == ["note"]
