"""A step's final failure, catchable as ``StepFailed`` in the main function, on every
backend, run by real workers over real stores.

- once a step has used its retries (or raised a non-retryable error), its call in the
  main function raises ``StepFailed`` (step id, call id, attempts, the error's class and
  message), recorded in the journal (status ``failed``) before it is raised;
- a main function that catches it goes on (a fallback step); a replay raises the same
  ``StepFailed`` from the journal without running the body again;
- uncaught, the task fails exactly as it did before the catch existed: the same reason,
  cause, step id and error class, and a journal without the failure, so a retry runs the
  step again;
- an effect's final failure is recorded in place of its intent and caught the same way.

(The crash points around the failure's commit are in
``tests/system/test_verb_crash_points.py``.)
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
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
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import StepFailed
from runifold_sync.outcomes import Completed, Failed, Retried, Suspended
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.journals import entries
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

RAN: Counter[str] = Counter()
TWICE = RetryPolicy(max_attempts=2, initial_backoff=timedelta(seconds=1))


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    HUNG_RELEASE.clear()
    yield
    RAN.clear()


def run_once(store: WorkflowStore, workflow: Workflow, worker_id: str = "w1") -> Any:
    return run_cycle(store, WorkflowDefinition(workflow), worker_id=worker_id)


def fields(failed: StepFailed) -> dict[str, Any]:
    return {
        "step_id": failed.step_id,
        "call_id": failed.call_id,
        "attempts": failed.attempts,
        "error_class": failed.error_class,
        "message": failed.message,
    }


# --- caught: a fallback ----------------------------------------------------------------------

payment = Workflow("payment", 1)


@payment.step(retry=TWICE)
def card(ctx: StepContext, amount: int) -> str:
    RAN["card"] += 1
    raise ValueError(f"card declined for {amount}")


@payment.step()
def invoice(ctx: StepContext, amount: int) -> str:
    RAN["invoice"] += 1
    return f"invoice for {amount}"


@payment.main
def payment_main(ctx: WorkflowContext, amount: int) -> dict[str, Any]:
    try:
        paid = card(ctx, amount)
    except StepFailed as failed:
        paid = invoice(ctx, amount)
        caught = fields(failed)
    else:
        caught = {}
    ctx.sleep(timedelta(minutes=1))  # the next claim replays the failure
    return {"paid": paid, "caught": caught}


def test_a_caught_final_failure_goes_on_and_replays_without_running_the_body(
    backend: Backend, clock: Clock
) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("payment", 1, 42, checkpoint_id="t1"))
    assert isinstance(run_once(store, payment), Retried)  # attempt 1 of 2
    clock.advance(timedelta(seconds=5))
    assert isinstance(run_once(store, payment, "w2"), Suspended)  # attempt 2 failed, caught
    assert RAN == {"card": 2, "invoice": 1}
    journal = entries(store, "t1")
    assert [(e["call_id"], e["status"]) for e in journal[:2]] == [("card#1", "failed"), ("invoice#1", "done")]
    assert journal[0]["output"]["attempts"] == 2 and journal[0]["output"]["error_class"] == "ValueError"

    clock.advance(timedelta(minutes=2))
    outcome = run_once(store, payment, "w3")
    assert RAN == {"card": 2, "invoice": 1}  # the replay raised the recorded failure
    expected = {
        "step_id": "card",
        "call_id": "card#1",
        "attempts": 2,
        "error_class": "ValueError",
        "message": "card declined for 42",
    }
    assert outcome == Completed("t1", {"paid": "invoice for 42", "caught": expected}), outcome


# --- uncaught: the task fails as before --------------------------------------------------------

strict = Workflow("strict", 1)


@strict.step(retry=RetryPolicy(max_attempts=1))
def reserve(ctx: StepContext, sku: str) -> str:
    RAN["reserve"] += 1
    raise KeyError(sku)


@strict.main
def strict_main(ctx: WorkflowContext, sku: str) -> str:
    return reserve(ctx, sku)


def test_an_uncaught_final_failure_fails_the_task_as_it_always_did(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("strict", 1, "sku-1", checkpoint_id="t1"))
    outcome = run_once(store, strict)
    assert isinstance(outcome, Failed), outcome
    assert outcome.reason == "step 'reserve' raised KeyError: 'sku-1'; gave up after 1 attempt"
    assert outcome.cause == "step_error"
    assert outcome.error is not None
    assert (outcome.error.error_class, outcome.error.message, outcome.error.step_id) == (
        "KeyError",
        "'sku-1'",
        "reserve",
    )
    assert outcome.error.traceback is not None and "KeyError: 'sku-1'" in outcome.error.traceback
    record = store.get_task("t1")
    assert record.reason == outcome.reason
    # Recorded (committed) for the main function to catch, then taken back out as the task
    # failed of it uncaught: the journal ends where it did, so an operator's retry runs the
    # step again.
    assert entries(store, "t1") == []
    store.requeue("t1", actor="ops", reason="stock fixed")
    assert isinstance(run_once(store, strict, "w2"), Failed)
    assert RAN == {"reserve": 2}


# --- an effect ---------------------------------------------------------------------------------

refund = Workflow("refund", 1)


@refund.effect(idempotent=True, retry=RetryPolicy(max_attempts=3, non_retryable=(PermissionError,)))
def send_refund(ctx: StepContext, order: str) -> str:
    RAN["send_refund"] += 1
    raise PermissionError(f"refunds of {order} need a manager")


@refund.main
def refund_main(ctx: WorkflowContext, order: str) -> dict[str, Any]:
    try:
        return {"refund": send_refund(ctx, order)}
    except StepFailed as failed:
        return {"escalated": fields(failed)}


def test_an_effects_non_retryable_failure_is_caught_in_place_of_its_intent(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("refund", 1, "o-7", checkpoint_id="t1"))
    outcome = run_once(store, refund)
    assert isinstance(outcome, Completed), outcome
    assert outcome.result == {
        "escalated": {
            "step_id": "send_refund",
            "call_id": "send_refund#1",
            "attempts": 1,
            "error_class": "PermissionError",
            "message": "refunds of o-7 need a manager",
        }
    }
    journal = entries(store, "t1")
    assert [(e["call_id"], e["kind"], e["status"], e["key"]) for e in journal] == [
        ("send_refund#1", "effect", "failed", "t1/send_refund#1")
    ]
    assert RAN == {"send_refund": 1}


# --- a last attempt found hung by a later claim ----------------------------------------------

HUNG_RELEASE = threading.Event()
SHORT = timedelta(milliseconds=300)

wedge = Workflow("wedge", 1)


@wedge.step(timeout=SHORT, retry=RetryPolicy(max_attempts=1))
def stuck(ctx: StepContext, n: int) -> int:
    RAN["stuck"] += 1
    assert HUNG_RELEASE.wait(30), "the test never released the hung attempt"
    return n


@wedge.main
def wedge_main(ctx: WorkflowContext, n: int) -> str:
    try:
        return f"got {stuck(ctx, n)}"
    except StepFailed as failed:
        return f"fell back after {failed.error_class} x{failed.attempts}"


def test_a_last_attempt_found_hung_by_another_worker_is_caught_there(backend: Backend) -> None:
    store, other_store = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("wedge", 1, 1, checkpoint_id="t1"))
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(wedge))
    lease, beat = LeaseDuration(timedelta(seconds=1)), timedelta(milliseconds=100)
    stuck_worker = WorkflowWorker(store, registry, WorkerId.parse("stuck"), lease, beat)
    other = WorkflowWorker(other_store, registry, WorkerId.parse("other"), lease, beat)
    thread = threading.Thread(target=stuck_worker.run_once, daemon=True)
    try:
        thread.start()
        deadline = time.monotonic() + 15
        while not RAN:  # the stuck worker's attempt began before the other looks
            assert time.monotonic() < deadline, "the first attempt never began"
            time.sleep(0.01)
        while (outcome := other.run_once()).kind == "idle":  # taken over once the lease lapses
            assert time.monotonic() < deadline, "no worker took the hung task over"
            time.sleep(0.02)
    finally:
        HUNG_RELEASE.set()
        thread.join(10)
        stuck_worker.close()
        other.close()
    assert outcome == Completed("t1", "fell back after StepTimedOut x1"), outcome
    assert RAN == {"stuck": 1}  # the body never ran again
    assert [(e["call_id"], e["status"]) for e in entries(store, "t1")] == [("stuck#1", "failed")]
