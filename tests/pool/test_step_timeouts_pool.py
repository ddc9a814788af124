"""Step timeouts in a supervised pool, started as an operator starts it
(``python -m runifold_sync run``), on SQLite and PostgreSQL: a body that sleeps for ever
cannot be interrupted, so the supervisor kills the child stuck in it at its deadline and
starts another; the lease, no longer extended, runs out and the task is claimed again,
which counts the attempt.

- a step with ``timeout=1s`` and ``max_attempts=2`` (lease 2 s, a pool of one) fails
  with the timeout reason within 30 s, after two attempts in two processes;
- a non-idempotent effect that timed out fails closed as ambiguous, and is settled by
  ``resolve_effect`` without running again; one with a ``reconcile`` is reconciled;
- SIGTERM on a pool whose child is stuck in a step (with no timeout) ends within the
  shutdown grace (``run --shutdown-grace``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.store import TaskOutcome, TaskState
from tests.support import ledger, processes
from tests.support.backends import Backend
from tests.system import timeout_app

LEASE_S = 2.0
WITHIN_S = 30.0


def _pool(backend: Backend, ledger_path: Path, *options: str) -> subprocess.Popen[str]:
    """A pool of one, run by the CLI, in a session of its own (``processes.kill`` ends
    its children too)."""
    return processes.spawn(
        "runifold_sync",
        "run",
        "--app",
        "tests.system.timeout_app:registry",
        "--database",
        backend.url,
        "--worker-id",
        "timeouts",
        "--lease",
        str(LEASE_S),
        "--heartbeat",
        "0.5",
        "--json",
        *options,
        env=dict(os.environ, **{timeout_app.LEDGER_ENV: str(ledger_path)}),
        stderr=subprocess.PIPE,
        own_session=True,
    )


def _finished(store: WorkflowStore, task_ids: list[str], within_s: float) -> float:
    """Seconds until every task is terminal; fails after ``within_s``."""
    started = time.monotonic()
    processes.wait_until(
        lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in task_ids),
        within_s,
        f"{task_ids} to finish",
        poll_s=0.1,
    )
    return time.monotonic() - started


def _stop(proc: subprocess.Popen[str]) -> tuple[dict[str, object], str]:
    """SIGTERM the pool; its JSON report and its log."""
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    return json.loads(stdout.splitlines()[-1]), stderr


@pytest.mark.timeout(120)
def test_a_step_stuck_past_its_timeout_fails_with_the_timeout_reason_within_30_s(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.open()
    ledger_path = tmp_path / "ledger.txt"
    store.enqueue(WorkflowTask.new("stuck", 1, 1, checkpoint_id="stuck-1"))
    proc = _pool(backend, ledger_path)
    try:
        took_s = _finished(store, ["stuck-1"], WITHIN_S)
        report, log = _stop(proc)
    finally:
        processes.kill(proc)
    record = store.get_task("stuck-1")
    assert (record.outcome, record.reason) == (
        TaskOutcome.FAILED,
        "step 'sleep_for_ever' timed out after 1s; gave up after 2 attempts",
    )
    # Each attempt: the timeout, then at most one lease before the next claim.
    assert took_s < 2 * (1 + LEASE_S) + 5, took_s
    runs = [line for line in ledger.read(ledger_path) if line[0] == "sleep_for_ever"]
    assert [line[3] for line in runs] == ["1", "2"]  # the kill was counted as attempt 1
    assert len({line[2] for line in runs}) == 2  # each in a process of its own
    failed = [e for e in store.history("stuck-1") if e.kind == "failed"]
    assert [(e.detail["error_class"], e.detail["step_id"]) for e in failed] == [
        ("StepTimedOut", "sleep_for_ever")
    ]
    usage = json.loads(record.checkpoint_json or "{}")["usage"]
    assert usage["elapsed_s"] >= 2 * timeout_app.TIMEOUT.total_seconds()  # the hung seconds counted
    assert (report["timed_out"], report["restarts"]) == (2, 2)
    assert log.count("runs a step past its timeout; killing it") == 2
    print(f"stuck step failed after {took_s:.1f} s on {backend.name}")


@pytest.mark.timeout(120)
def test_an_effect_stuck_past_its_timeout_fails_closed_or_is_reconciled(
    backend: Backend, tmp_path: Path
) -> None:
    store = backend.open()
    ledger_path = tmp_path / "ledger.txt"
    store.enqueue(WorkflowTask.new("stuck-effect", 1, 1, checkpoint_id="ambiguous"))
    store.enqueue(WorkflowTask.new("stuck-reconciled", 1, 1, checkpoint_id="reconciled"))
    proc = _pool(backend, ledger_path)
    try:
        _finished(store, ["ambiguous", "reconciled"], WITHIN_S)
        record = store.get_task("ambiguous")
        key = "ambiguous/charge_for_ever#1"
        assert (record.outcome, record.ambiguous_effect) == (TaskOutcome.FAILED, key)
        assert record.reason == (
            "effect 'charge_for_ever' timed out after 1s; ambiguous effect: 'charge_for_ever' of task "
            f"'ambiguous' (idempotency key {key}) was interrupted and its outcome is unknown; resolve it "
            f"with resolve_effect or on the command line: python -m runifold_sync resolve ambiguous '{key}' "
            "(--applied [--result JSON] | --not-applied) --actor WHO --reason WHY"
        )
        store.resolve_effect(
            "ambiguous",
            key,
            applied=True,
            result_json='"charged by hand"',
            actor="ops",
            reason="seen at the bank",
        )
        _finished(store, ["ambiguous"], WITHIN_S)
        _stop(proc)
    finally:
        processes.kill(proc)
    assert (store.get_task("ambiguous").outcome, store.get_task("ambiguous").result) == (
        TaskOutcome.COMPLETED,
        "charged by hand",
    )
    reconciled = store.get_task("reconciled")
    assert (reconciled.outcome, reconciled.result) == (
        TaskOutcome.COMPLETED,
        "charged reconciled/charge_and_hang#1",
    )
    bodies = [line[0] for line in ledger.read(ledger_path)]
    assert sorted(bodies) == ["charge_and_hang", "charge_for_ever"]  # neither ran again on a guess


@pytest.mark.timeout(120)
def test_sigterm_on_a_pool_with_a_child_stuck_in_a_step_exits_within_the_shutdown_grace(
    backend: Backend, tmp_path: Path
) -> None:
    ledger_path = tmp_path / "ledger.txt"
    store = backend.open()
    store.enqueue(WorkflowTask.new("hang", 1, 1, checkpoint_id="hang-1"))
    grace_s = 2.0
    proc = _pool(backend, ledger_path, "--shutdown-grace", str(grace_s))
    try:
        processes.wait_until(lambda: ledger.read(ledger_path), 30, "the step to begin")
        asked = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _stdout, log = proc.communicate(timeout=30)
        took_s = time.monotonic() - asked
    finally:
        processes.kill(proc)
    assert proc.returncode == 0, log
    assert grace_s <= took_s < grace_s + 3, took_s
    assert "worker timeouts-0 did not stop within the shutdown grace of 2 s; killing it" in log
    assert store.get_task("hang-1").state is TaskState.LEASED  # claimed again once its lease runs out
