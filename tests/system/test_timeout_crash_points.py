"""The crash-point cases of step and effect timeouts: a worker process running the
``timed`` flow (``tests.system.timeout_app``) killed (SIGKILL) around the write a
timeout adds, the deadline committed before a body runs, on every backend; then store
time moves past the dead worker's lease and a worker in this process finishes the task.
The ledger says which bodies ran, and as which attempt:

- a crash before the deadline's commit leaves nothing to count: the body runs once, as
  attempt 1;
- once the deadline is durable, the attempt counts, whether its body never began, ran
  and lost its result, or ran past its deadline: the next claim runs attempt 2 (a step
  or an idempotent effect), and says why;
- the deadline of a non-idempotent effect rides its intent's commit: past it, the effect
  timed out and, with no reconcile, fails closed as ambiguous (the reason names the
  timeout); ``resolve_effect`` as not applied then runs it once;
- an idempotent effect run again after an interrupted attempt commits its new deadline
  first: a crash before that commit counts the first attempt again, after it both.
"""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from pathlib import Path

import attrs
import pytest

from runifold_sync import WorkerId, WorkflowStore, WorkflowTask, WorkflowWorker
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support import ledger, processes
from tests.support.backends import Backend
from tests.support.journals import entries

from . import crash_app, timeout_app

TASK = "t1"
CHARGE_KEY = f"{TASK}/charge#1"
RESULT = {"notice": f"notified {TASK}/notify#1", "charge": f"ch-{CHARGE_KEY}"}
P, N_INTENT = "prepare#1:done", "notify#1:intent"


@attrs.frozen
class TimeoutCase:
    crash: tuple[str, ...]  # RUNIFOLD_CRASH_AT of each process, run one after the other
    journal: tuple[str, ...]  # "call id:status" in the checkpoint after the crashes
    deadlines: tuple[str, ...]  # call ids with a deadline in the head after the crashes
    attempts: dict[str, tuple[int, ...]]  # the attempt number of each run of each body
    ambiguous: bool = False  # the recovery fails closed on charge, then it is resolved
    why: str | None = None  # what the recovery logs about the attempt it counted


ONCE = {"prepare": (1,), "notify": (1,), "charge": (1,)}
INTERRUPTED = "did not finish: its worker stopped before its 30s timeout ran out"

TIMEOUT_CASES = {
    "before_step_deadline_commit": TimeoutCase(("before_commit:prepare#1:deadline",), (), (), ONCE),
    "after_step_deadline_commit": TimeoutCase(
        ("after_commit:prepare#1:deadline",),
        (),
        ("prepare#1",),
        {**ONCE, "prepare": (2,)},
        why=f"step 'prepare' {INTERRUPTED} (attempt 1 of 3)",
    ),
    "after_timed_step_body": TimeoutCase(
        ("after_step:prepare#1",),
        (),
        ("prepare#1",),
        {**ONCE, "prepare": (1, 2)},
        why=f"step 'prepare' {INTERRUPTED} (attempt 1 of 3)",
    ),
    "before_timed_intent_commit": TimeoutCase(
        ("before_commit:charge#1:intent",), (P, "notify#1:done"), (), ONCE
    ),
    "after_timed_intent_commit": TimeoutCase(
        ("after_commit:charge#1:intent",),
        (P, "notify#1:done", "charge#1:intent"),
        ("charge#1",),
        ONCE,  # past its 1 s deadline: ambiguous, then resolved as not applied and run
        ambiguous=True,
    ),
    "before_rerun_deadline_commit": TimeoutCase(
        ("after_commit:notify#1:intent", "before_commit:notify#1:deadline"),
        (P, N_INTENT),
        ("notify#1",),
        {**ONCE, "notify": (2,)},
        why=f"effect 'notify' {INTERRUPTED} (attempt 1 of 3)",
    ),
    "after_rerun_deadline_commit": TimeoutCase(
        ("after_commit:notify#1:intent", "after_commit:notify#1:deadline"),
        (P, N_INTENT),
        ("notify#1",),
        {**ONCE, "notify": (3,)},
        why=f"effect 'notify' {INTERRUPTED} (attempt 2 of 3)",
    ),
}


def _crash(backend: Backend, ledger_path: Path, spec: str) -> None:
    env = dict(os.environ, RUNIFOLD_CRASH_AT=spec)
    args = ["--url", backend.url, "--ledger", str(ledger_path), "--task", TASK]
    proc = processes.run("tests.system.timeout_app", *args, env=env, timeout_s=60)
    point, _, subject = spec.partition(":")
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stdout, proc.stderr)
    assert f"runifold crash point {point}:{subject}" in proc.stderr, proc.stderr


def _journal(store: WorkflowStore) -> tuple[str, ...]:
    return tuple(f"{e['call_id']}:{e['status']}" for e in entries(store, TASK))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(TIMEOUT_CASES))
def test_timeout_crash_point(
    name: str,
    backend: Backend,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    case = TIMEOUT_CASES[name]
    ledger_path = tmp_path / "ledger.txt"
    monkeypatch.setenv(timeout_app.LEDGER_ENV, str(ledger_path))
    store = backend.open()
    store.enqueue(WorkflowTask.new("timed", 1, "order-1", checkpoint_id=TASK))

    offset = timedelta(0)
    for spec in case.crash:
        _crash(backend, ledger_path, spec)
        offset += crash_app.LEASE.value * 3  # past the dead worker's lease
        store.set_clock_offset(offset)
    assert _journal(store) == case.journal
    checkpoint = read_checkpoint(store, TASK)
    assert tuple(checkpoint.deadlines if checkpoint else ()) == case.deadlines
    assert store.get_task(TASK).state is TaskState.LEASED

    caplog.set_level("WARNING")
    worker = WorkflowWorker(
        store, timeout_app.build_registry(), WorkerId.parse("recovery"), crash_app.LEASE, crash_app.HEARTBEAT
    )
    try:
        crash_app.drive(worker, TASK)
        if case.ambiguous:
            record = store.get_task(TASK)
            assert (record.outcome, record.ambiguous_effect) == (TaskOutcome.FAILED, CHARGE_KEY)
            assert record.reason is not None
            assert record.reason.startswith("effect 'charge' timed out after 1s; ambiguous effect:"), (
                record.reason
            )
            store.resolve_effect(
                TASK, CHARGE_KEY, applied=False, result_json=None, actor="ops", reason="not at the bank"
            )
            crash_app.drive(worker, TASK)
    finally:
        worker.close()
    record = store.get_task(TASK)
    assert (record.state, record.outcome, record.result) == (
        TaskState.TERMINAL,
        TaskOutcome.COMPLETED,
        RESULT,
    )
    attempts: dict[str, list[int]] = {}
    for body, _task, _pid, attempt, *_key in ledger.read(ledger_path):
        attempts.setdefault(body, []).append(int(attempt))
    assert {body: tuple(runs) for body, runs in attempts.items()} == case.attempts
    if case.why is not None:
        assert f"{case.why}; running it again" in caplog.text
    final = read_checkpoint(store, TASK)
    assert final is not None and final.deadlines == {} and final.step_failures == {}
