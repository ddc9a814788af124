"""What a failed run says of its failure: ``Failed.error`` names the error's class, the
step and the effect key it failed in, and the ``failed`` history event records the same
fields for ``show``. And a lost lease, carried through user code by the engine's
``Unwind`` interrupt, still escapes a workflow's ``except Exception``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowTask,
)
from runifold_sync.errors import AmbiguousEffect, NonDeterminism
from runifold_sync.outcomes import Failed, FailureDetail, LeaseLost, RunOutcome, Suspended
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.support.backends import sqlite_clock
from tests.support.clock import Clock
from tests.support.workers import WorkerFactory

# The in-process worker tests move the clock of ``sqlite_store``.
clock = sqlite_clock

ONCE = RetryPolicy(max_attempts=1)


class SimulatedCrash(BaseException):
    """Escapes every ``except Exception``: the worker process 'dies' mid-call."""


class Opaque:
    """A step result the JSON codec cannot store."""


def _enqueue(store: SqliteWorkflowStore, wf: Workflow) -> str:
    return store.enqueue(WorkflowTask.new(wf.name, wf.version, None)).task_id


def _failed(outcome: RunOutcome) -> Failed:
    assert isinstance(outcome, Failed), outcome
    assert outcome.error is not None
    return outcome


def _failed_event(store: SqliteWorkflowStore, task_id: str) -> dict[str, Any]:
    event = store.history(task_id)[-1]
    assert event.kind == "failed"
    return event.detail


def test_a_step_failing_its_last_attempt_names_the_step_and_its_exception(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = Workflow("failing-step", 1)

    @wf.step(retry=ONCE)
    def fetch(ctx: StepContext) -> str:
        raise ConnectionError("upstream timed out")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return fetch(ctx)

    task_id = _enqueue(sqlite_store, wf)
    outcome = _failed(make_worker(WorkflowDefinition(wf)).run_once())

    assert outcome.cause == "step_error"
    assert outcome.error == FailureDetail("ConnectionError", "upstream timed out", task_id, "fetch", None)
    assert outcome.error.traceback is not None
    assert _failed_event(sqlite_store, task_id) == {
        "reason": outcome.reason,
        "error_class": "ConnectionError",
        "step_id": "fetch",
        "effect_key": None,
        "traceback": outcome.error.traceback,
    }


def test_an_effect_failing_its_last_attempt_also_names_its_idempotency_key(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = Workflow("failing-effect", 1)

    @wf.effect(idempotent=True, retry=ONCE)
    def charge(ctx: StepContext) -> str:
        raise ValueError("card declined")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return charge(ctx)

    task_id = _enqueue(sqlite_store, wf)
    outcome = _failed(make_worker(WorkflowDefinition(wf)).run_once())

    key = f"{task_id}/charge#1"
    assert outcome.error == FailureDetail("ValueError", "card declined", task_id, "charge", key)
    assert not outcome.recoverable  # it failed; its outcome is not unknown
    detail = _failed_event(sqlite_store, task_id)
    assert (detail["error_class"], detail["step_id"], detail["effect_key"]) == ("ValueError", "charge", key)
    assert "ambiguous_effect" not in detail


def test_a_non_determinism_failure_names_the_error_and_the_step_asked_for(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = Workflow("diverging", 1)
    state = {"go_right": False}

    @wf.step()
    def left(ctx: StepContext) -> str:
        return "left"

    @wf.step()
    def right(ctx: StepContext) -> str:
        return "right"

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        first = right(ctx) if state["go_right"] else left(ctx)
        ctx.sleep(timedelta(seconds=10))
        return first

    worker = make_worker(WorkflowDefinition(wf))
    task_id = _enqueue(sqlite_store, wf)
    assert isinstance(worker.run_once(), Suspended)
    state["go_right"] = True  # the main function no longer makes the call it recorded
    clock.advance(11)
    outcome = _failed(worker.run_once())

    error = NonDeterminism(task_id, 0, "left#1", "right#1")
    assert outcome.cause == "nondeterminism"
    assert outcome.error == FailureDetail("NonDeterminism", str(error), task_id, "right", None)
    assert outcome.reason == str(error)
    detail = _failed_event(sqlite_store, task_id)
    assert (detail["error_class"], detail["step_id"]) == ("NonDeterminism", "right")


def test_an_ambiguous_effect_names_the_error_and_the_effect_key(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = Workflow("ambiguous", 1)
    crashes = [SimulatedCrash()]

    @wf.effect(idempotent=False)
    def charge(ctx: StepContext) -> str:
        if crashes:
            raise crashes.pop()
        return "charged"

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return charge(ctx)

    worker = make_worker(WorkflowDefinition(wf))
    task_id = _enqueue(sqlite_store, wf)
    with pytest.raises(SimulatedCrash):  # the worker dies inside the effect
        worker.run_once()
    clock.advance(31)
    outcome = _failed(worker.run_once())

    key = f"{task_id}/charge#1"
    error = AmbiguousEffect(task_id, "charge", key)
    assert (outcome.cause, outcome.recoverable) == ("ambiguous_effect", True)
    assert outcome.error == FailureDetail("AmbiguousEffect", str(error), task_id, "charge", key)
    assert _failed_event(sqlite_store, task_id) == {
        "reason": str(error),
        "ambiguous_effect": key,
        "error_class": "AmbiguousEffect",
        "step_id": "charge",
        "effect_key": key,
    }


def test_a_step_output_that_cannot_be_stored_names_the_error_and_the_step(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = Workflow("unstorable", 1)

    @wf.step()
    def build(ctx: StepContext) -> Opaque:
        return Opaque()

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        build(ctx)

    task_id = _enqueue(sqlite_store, wf)
    outcome = _failed(make_worker(WorkflowDefinition(wf)).run_once())

    assert outcome.cause == "not_serializable"
    assert _failed_event(sqlite_store, task_id)["error_class"] == "OutputNotSerializable"
    assert outcome.error is not None
    assert (outcome.error.error_class, outcome.error.step_id) == ("OutputNotSerializable", "build")
    assert outcome.error.message.startswith("output of 'build#1' cannot be stored as JSON")
    assert outcome.error.message == outcome.reason


def test_a_failure_that_no_exception_caused_has_no_error_class(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = Workflow("misuse", 1)

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        ctx.wait_for_signal("never-declared")

    task_id = _enqueue(sqlite_store, wf)
    outcome = _failed(make_worker(WorkflowDefinition(wf)).run_once())

    assert outcome.cause == "misuse"
    assert outcome.error == FailureDetail(None, outcome.reason, task_id)


def test_a_lost_lease_escapes_the_workflows_except_exception(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = Workflow("guarded", 1)
    calls: list[str] = []

    @wf.step()
    def slow(ctx: StepContext) -> str:
        clock.advance(31)  # the step outlives its lease, and another worker takes the task
        sqlite_store.claim(WorkerId.parse("other"), LeaseDuration(timedelta(seconds=30)))
        return "late"

    @wf.step()
    def after(ctx: StepContext) -> None:
        calls.append("after")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        try:
            slow(ctx)
            after(ctx)  # its boundary commits slow's result: the store refuses the write
        except Exception as exc:  # must not catch the lost lease
            calls.append(f"swallowed {type(exc).__name__}")
        return "done"

    task_id = _enqueue(sqlite_store, wf)
    outcome = make_worker(WorkflowDefinition(wf)).run_once()

    assert outcome == LeaseLost(task_id, 1, "checkpoint commit")
    assert calls == []
    record = sqlite_store.get_task(task_id)
    assert (record.worker_id, record.fencing_token) == ("other", 2)
