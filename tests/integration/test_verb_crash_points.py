"""The crash points of the workflow verbs of issue 48, on both stores: a worker process
(``tests.integration.verb_app``) SIGKILLed at each, then a worker in this process
finishing the task; the ledger the bodies write says what ran, and with what.

- ``ctx.now()`` has no write of its own: its record rides the next commit (here the
  commit of the step it was handed to). Killed after that commit, the recovery replays
  the recorded time: the step ran once, the result carries the time it was given.
  Killed before it, both are lost together and the step runs again with a fresh time.
- A step's final failure (``StepFailed``) is committed (``<call id>:failed``) before it is
  raised. Killed before that commit, the recovery runs the failed attempt again (the
  failure was never recorded); after it, the recovery replays the recorded failure and
  the body never runs again. Either way the fallback runs once.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import attrs
import pytest

from runifold_sync import WorkerId, WorkflowTask, WorkflowWorker
from runifold_sync.store import TaskOutcome
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


CASES = {
    "now_before_commit": Case("before_commit:stamp#1", (), {"stamp": 2, "doomed": 1, "fallback": 1}, False),
    "now_after_commit": Case(
        "after_commit:stamp#1", ("now#1:done", "stamp#1:done"), {"stamp": 1, "doomed": 1, "fallback": 1}
    ),
    "failed_before_commit": Case(
        "before_commit:doomed#1:failed",
        ("now#1:done", "stamp#1:done"),
        {"stamp": 1, "doomed": 2, "fallback": 1},
    ),
    "failed_after_commit": Case(
        "after_commit:doomed#1:failed",
        ("now#1:done", "stamp#1:done", "doomed#1:failed"),
        {"stamp": 1, "doomed": 1, "fallback": 1},
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
    proc = processes.run("tests.integration.verb_app", *args, env=env, timeout_s=60)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert case.crash.split(":")[0] in proc.stderr
    journal = tuple(f"{e['call_id']}:{e['status']}" for e in entries(store, TASK))
    assert journal == case.journal
    first_stamp = ledger.read(ledger_path)[0]
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
    assert Counter(line[0] for line in lines) == case.runs
    stamps = [line[3] for line in lines if line[0] == "stamp"]
    assert stamps[0] == first_stamp[3]
    # The time the workflow returns is the time its (last) stamp was given: replayed when
    # the first was recorded, read afresh when the crash lost it.
    assert record.result["at"] == stamps[-1]
    if case.same_time:
        assert record.result["at"] == first_stamp[3]
    recorded = [e for e in entries(store, TASK) if e["kind"] == "now"]
    assert [e["output"] for e in recorded] == [record.result["at"]]
