"""The crash cases of the workflow verbs' writes (issue 48), on every backend: a worker
process (``tests.system.verbs_crash_app``) killed (SIGKILL) just before and just
after the fenced commit that carries them, then a worker in this process finishes the
task. The crash points are the matrix's ``before_commit``/``after_commit``, with the
subject each write names (``attributes:<key>+<key>...``, ``stream:<key>:<seq>``):

- killed before the attributes' commit, nothing of it is stored, and the step result it
  carries is lost too (that step runs again); the resumed run sets them;
- killed after it, the attributes are stored with the step before them; the resumed run
  (at the journal's end) writes the same values again, and that step never runs again.

Either way the task ends with the attributes set once, each step run as the commit
order says. The same holds of a stream value, which is moreover appended exactly once:
made again at the journal's end after its commit, it is recognised and not appended.

A detached child is enqueued (detached, in the one insert) before the parent's commit
records it: killed there (``before_step:finish#1``) and then cancelled, the parent ends
cancelled while its one detached child, not cancelled, runs to its end.

An update's rejection and reply are events (``event:update:<id>``): killed around either
commit, the update is answered once and only the accepted one is in the journal. A step
body's stream write (``stream:<key>:<call id>:<seq>``) is appended once however often the
step runs again. And the tick of a schedule created at run time, by a worker
(``schedule_app``) killed around it (``before_tick``/``after_tick``), is created once.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from runifold_sync import Schedule, WorkerId, WorkflowTask, WorkflowWorker
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.records import StreamRead, StreamValue
from runifold_sync.worker.schedule_ticker import ScheduleTicks
from tests.support import ledger, processes
from tests.support.backends import Backend
from tests.support.clock import Clock
from tests.support.journals import entries

from . import crash_app, schedule_app, verbs_crash_app

TASK = "v1"
PREPARED = {"customer": "order-1", "stage": "prepared"}


@attrs.frozen
class VerbCase:
    crash: str  # RUNIFOLD_CRASH_AT of the worker process
    attributes: dict[str, Any]  # stored when it died
    ran_twice: tuple[str, ...] = ()
    cancel: bool = False  # the parent is cancelled after the crash
    streamed: int = 1  # stream values stored when it died


VERB_CASES = {
    "before_attributes_commit": VerbCase(
        "before_commit:attributes:customer+stage", {}, ran_twice=("prepare",), streamed=0
    ),
    "after_attributes_commit": VerbCase(
        "after_commit:attributes:customer+stage", {"customer": "order-1", "stage": "prepared"}, streamed=0
    ),
    "before_stream_commit": VerbCase(
        "before_commit:stream:progress:1", {"customer": "order-1", "stage": "prepared"}, streamed=0
    ),
    # A step body's stream write: killed before it, nothing; after it, the value is
    # stored but not the step's result. Either way the step runs again, and its write,
    # recognised as the same (call id, seq), is appended once in all.
    "before_step_stream_write": VerbCase(
        "before_commit:stream:steps:prepare#1:1", {}, ran_twice=("prepare",), streamed=0
    ),
    "after_step_stream_write": VerbCase(
        "after_commit:stream:steps:prepare#1:1", {}, ran_twice=("prepare",), streamed=0
    ),
    # A rejection is answered (event update:u0) before the update leaves the pending
    # signals: killed before, the next claim rejects it; after, it rejects it again (the
    # same answer) and takes it out. Either way no journal entry: only u1's.
    "before_rejection_commit": VerbCase("before_commit:event:update:u0", PREPARED),
    "after_rejection_commit": VerbCase("after_commit:event:update:u0", PREPARED),
    "before_reply_commit": VerbCase("before_commit:event:update:u1", PREPARED),
    "after_reply_commit": VerbCase("after_commit:event:update:u1", PREPARED),
    # The resumed run reaches the write at its journal's end and makes it again: the
    # store recognises it (same run, writer and seq) and appends nothing.
    "after_stream_commit": VerbCase(
        "after_commit:stream:progress:1", {"customer": "order-1", "stage": "prepared"}
    ),
    "detached_child_enqueued_then_cancel": VerbCase(
        "before_step:finish#1", {"customer": "order-1", "stage": "prepared"}, cancel=True
    ),
}
CHILD = f"{TASK}:child:verbs-audit-1"
REJECTED = {"rejected": "rejected by the validator of update 'add': ValueError: quantity must be positive"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(VERB_CASES))
def test_verb_crash_point(
    name: str, backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = VERB_CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(verbs_crash_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    store.enqueue(WorkflowTask.new("verbs", 1, "order-1", checkpoint_id=TASK))
    store.send_signal(TASK, "add", {"quantity": 0}, signal_id="u0", sender="test")
    store.send_signal(TASK, "add", {"quantity": 2}, signal_id="u1", sender="test")
    env = dict(os.environ, RUNIFOLD_CRASH_AT=case.crash)
    args = ["--url", backend.url, "--ledger", str(ledger_path), "--task", TASK]
    proc = processes.run("tests.system.verbs_crash_app", *args, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {case.crash}" in proc.stderr, proc.stderr
    assert store.task_attributes(TASK) == case.attributes
    assert len(store.read_stream(TASK, "progress").values) == case.streamed
    if case.cancel:
        assert store.get_task(CHILD).detached
        assert store.cancel(TASK, actor="test", reason="stop") is TaskState.LEASED
    store.set_clock_offset(crash_app.LEASE.value * 3)  # past the dead worker's lease

    worker = WorkflowWorker(
        store, verbs_crash_app.registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        crash_app.drive(worker, TASK)
        crash_app.drive(worker, CHILD)
    finally:
        worker.close()
    record = store.get_task(TASK)
    child = store.get_task(CHILD)
    assert (child.state, child.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    assert child.result == "audited order-1"
    assert [t.task_id for t in store.list_tasks(parent=TASK)] == [CHILD]  # one child, never two
    assert store.read_stream(TASK, "progress") == StreamRead([StreamValue(1, "prepared order-1")], True, 1)
    assert store.read_stream(TASK, "steps").values == [StreamValue(1, "preparing")]
    if not case.cancel:
        assert store.get_event(TASK, "update:u0") == REJECTED
        assert store.get_event(TASK, "update:u1") == {"reply": {"added": 2}}
        signals = [e for e in entries(store, TASK) if e["kind"] == "signal"]
        assert [e["output"]["signal_id"] for e in signals] == ["u1"]  # no trace of u0
        assert store.pending_signals(TASK) == []
    if case.cancel:
        assert record.state is TaskState.CANCELLED
        assert Counter(line[0] for line in ledger.read(ledger_path)) == {"prepare": 1}
        return
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    assert record.result == "done"
    assert store.task_attributes(TASK) == {"customer": "order-1", "stage": "prepared"}
    runs = Counter(line[0] for line in ledger.read(ledger_path))
    assert runs == {body: 2 if body in case.ran_twice else 1 for body in verbs_crash_app.BODIES}


# --- the tick of a schedule created at run time -------------------------------------

CREATED = Schedule("created-hourly", "ticked", 1, every=timedelta(hours=1))


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("crash", "stored"), [("before_tick:created-hourly", False), ("after_tick:created-hourly", True)]
)
def test_created_schedule_tick_crash_point(
    crash: str, stored: bool, backend: Backend, tmp_path: Path
) -> None:
    """A worker (``schedule_app``, whose registry serves ``ticked`` but does not declare
    this schedule) killed just before and after creating the due tick of a schedule
    created at run time: the tick's task is created exactly once, by the next look."""
    store = backend.open()
    clock = Clock(store)
    record = store.create_schedule(CREATED)
    tick = CREATED.times.next_after(record.active_since)
    clock.advance(tick + timedelta(minutes=1) - store.now())
    env = dict(os.environ, RUNIFOLD_CRASH_AT=crash)
    proc = processes.run("tests.system.schedule_app", "--url", backend.url, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {crash} reached" in proc.stderr, proc.stderr

    def ticks() -> list[str]:
        return [
            t.task_id
            for t in store.list_tasks(limit=1000)
            if t.task_id.startswith("schedule:created-hourly:")
        ]

    assert ticks() == ([CREATED.task_id(tick)] if stored else [])
    assert store.schedule("created-hourly").last_tick == (tick if stored else None)
    created = ScheduleTicks(store, schedule_app.registry()).run().created
    assert [c for c in created if "created-hourly" in c] == ([] if stored else [CREATED.task_id(tick)])
    assert ticks() == [CREATED.task_id(tick)]
    assert [e.kind for e in store.history(CREATED.task_id(tick))].count("enqueued") == 1
