"""A task's input that does not fit its main function's type, when a worker runs it, on
every store (issue 19, finding 3): the task fails with each wrong field named, as
``WorkflowRegistry.task`` would have said at enqueue, and nothing is coerced. A run that
already started under coercion goes on with the input it started with."""

from __future__ import annotations

import logging
from datetime import timedelta

import attrs
import pytest

from runifold_sync import (
    LeaseDuration,
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
from runifold_sync.outcomes import Completed, Failed, Suspended
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))


@attrs.frozen
class Line:
    sku: str
    qty: int


@attrs.frozen
class Invoice:
    invoice_id: int
    lines: list[Line]


invoicing = Workflow("invoicing", 1, signals=["paid"])


@invoicing.step()
def total(ctx: StepContext, invoice_id: int) -> int:
    return invoice_id * 100


@invoicing.main
def invoicing_main(ctx: WorkflowContext, invoice: Invoice) -> dict[str, int]:
    amount = total(ctx, invoice.invoice_id)
    ctx.wait_for_signal("paid")
    if invoice.invoice_id == 0:
        ctx.continue_as_new({"invoice_id": "x", "lines": []})
    return {"invoice": invoice.invoice_id, "amount": amount}


def _worker(store: WorkflowStore, *, coerce_input: bool = False, worker_id: str = "w1") -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(invoicing, coerce_input=coerce_input))
    return WorkflowWorker(store, registry, WorkerId.parse(worker_id), LEASE, timedelta(seconds=10))


def test_input_that_does_not_fit_fails_the_task_naming_each_field(store: WorkflowStore) -> None:
    bad = {"invoice_id": "7", "lines": [{"sku": "a-1"}]}
    store.enqueue(WorkflowTask.new("invoicing", 1, bad, checkpoint_id="t1"))  # unchecked
    worker = _worker(store)
    try:
        outcome = worker.run_once()
    finally:
        worker.close()

    reason = (
        "input does not fit tests.engine.test_input_at_run_time.Invoice: "
        "input.invoice_id: expected an integer, got the string '7'; "
        "input.lines[0].qty: required field missing"
    )
    assert isinstance(outcome, Failed) and outcome.reason == reason
    assert outcome.error is not None and outcome.error.error_class == "InputMismatch"
    assert store.get_task("t1").reason == reason
    (failed,) = [e.detail for e in store.history("t1") if e.kind == "failed"]
    assert (failed["reason"], failed["error_class"]) == (reason, "InputMismatch")


def test_a_run_started_with_coerced_input_goes_on_with_it_under_a_strict_definition(
    store: WorkflowStore, caplog: pytest.LogCaptureFixture
) -> None:
    store.enqueue(WorkflowTask.new("invoicing", 1, {"invoice_id": "7", "lines": []}, checkpoint_id="t1"))
    before = _worker(store, coerce_input=True, worker_id="old")
    try:
        assert isinstance(before.run_once(), Suspended)  # its step ran with 7
    finally:
        before.close()
    store.send_signal("t1", "paid", None, signal_id="p1", sender="bank")

    after = _worker(store, worker_id="new")
    try:
        with caplog.at_level(logging.WARNING, logger="runifold_sync.worker.worker"):
            outcome = after.run_once()
    finally:
        after.close()

    assert outcome == Completed("t1", {"invoice": 7, "amount": 700})
    assert any("the run started with this input coerced" in r.getMessage() for r in caplog.records)


def test_continue_as_new_with_input_that_does_not_fit_fails_naming_the_field(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("invoicing", 1, {"invoice_id": 0, "lines": []}, checkpoint_id="t0"))
    worker = _worker(store)
    try:
        assert isinstance(worker.run_once(), Suspended)
        store.send_signal("t0", "paid", None, signal_id="p1", sender="bank")
        outcome = worker.run_once()
    finally:
        worker.close()

    assert isinstance(outcome, Failed)
    assert outcome.error is not None and outcome.error.error_class == "InputMismatch"
    assert "continue_as_new input does not fit" in outcome.reason
    assert "input.invoice_id: expected an integer, got the string 'x'" in outcome.reason
