"""A failed step's traceback is kept by every store: the ``failed`` event's detail holds
it, bounded, as the worker's ``Failed.error`` does, whatever characters the exception's
message held; and a programming error fails the task at its first attempt."""

from __future__ import annotations

import logging
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
from runifold_sync.model.tracebacks import MAX_TRACEBACK_BYTES
from runifold_sync.outcomes import Failed, FailureDetail
from runifold_sync.store import TaskState
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
ATTEMPTS: list[int] = []

traced = Workflow("traced", 1)


def _total(lines: list[dict[str, Any]]) -> float:
    return sum(line["price"] * line["qty"] for line in lines)


def _descend(depth: int, message: str) -> None:
    """Raise ``depth`` frames down, from two call sites in turn (so that Python does not
    fold the frames into one "repeated" line)."""
    if depth == 0:
        raise ValueError(message)
    if depth % 2:
        _descend(depth - 1, message)
    else:
        _descend(depth - 1, message)


@traced.step(retry=RetryPolicy(max_attempts=3))
def price(ctx: StepContext, order: dict[str, Any]) -> float:
    ATTEMPTS.append(ctx.attempt)
    return _total(order["lines"])  # a price given as text: str * int, then str + int


@traced.step(retry=RetryPolicy(max_attempts=1))
def check(ctx: StepContext, order: dict[str, Any]) -> None:
    # U+0000 cannot be part of a task's input; an exception raised in a step may hold it.
    # Nor a lone surrogate, which a message decoded with errors="surrogateescape" holds.
    _descend(order.get("depth", 0), order["message"].replace("{nul}", "\x00").replace("{lone}", "\udc80"))


@traced.main
def main(ctx: WorkflowContext, order: dict[str, Any]) -> float:
    if "lines" in order:
        return price(ctx, order)
    check(ctx, order)
    return 0.0


@pytest.fixture(autouse=True)
def _fresh_attempts() -> None:
    ATTEMPTS.clear()


def _fail(store: WorkflowStore, order: dict[str, Any]) -> Failed:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(traced))
    worker = WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=5))
    store.enqueue(WorkflowTask.new("traced", 1, order, checkpoint_id="t1"))
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
    assert isinstance(outcome, Failed), outcome
    return outcome


def _failed_detail(backend: Backend) -> dict[str, Any]:
    """The ``failed`` event as another store on the database reads it back."""
    event = backend.open().history("t1")[-1]
    assert event.kind == "failed"
    return event.detail


def test_a_type_error_fails_at_once_and_its_event_keeps_the_traceback(
    backend: Backend, store: WorkflowStore
) -> None:
    outcome = _fail(store, {"lines": [{"price": "9.90", "qty": 2}]})

    assert ATTEMPTS == [1]  # three attempts allowed: a TypeError is not retried
    assert store.get_task("t1").state is TaskState.TERMINAL
    assert outcome.error is not None and outcome.error.error_class == "TypeError"
    kept = outcome.error.traceback
    assert kept is not None
    assert "in price\n" in kept and "in _total\n" in kept
    assert kept.endswith("TypeError: unsupported operand type(s) for +: 'int' and 'str'\n")
    detail = _failed_detail(backend)
    assert detail["traceback"] == kept
    assert (detail["error_class"], detail["step_id"]) == ("TypeError", "price")


def test_a_deep_traceback_is_stored_bounded_with_its_newest_frames(
    backend: Backend, store: WorkflowStore
) -> None:
    outcome = _fail(store, {"depth": 300, "message": "out of stock"})

    assert outcome.cause == "step_error"
    kept = _failed_detail(backend)["traceback"]
    assert len(kept.encode()) <= MAX_TRACEBACK_BYTES
    assert kept.startswith("[") and " earlier lines of this traceback cut]\n" in kept
    assert kept.endswith("    raise ValueError(message)\nValueError: out of stock\n")
    assert outcome.error is not None and outcome.error.traceback == kept


def test_a_traceback_with_characters_no_json_column_holds_is_kept_as_escapes(
    backend: Backend, store: WorkflowStore
) -> None:
    outcome = _fail(store, {"message": "sku {nul} unknown"})

    kept = _failed_detail(backend)["traceback"]
    assert kept.endswith("ValueError: sku \\x00 unknown\n")
    assert outcome.error is not None and outcome.error.traceback == kept


def test_a_step_error_whose_message_holds_a_lone_surrogate_fails_the_task_with_it_escaped(
    backend: Backend, store: WorkflowStore
) -> None:
    """Before, the failing write itself raised (UTF-8 cannot encode the surrogate): the
    cycle crashed and the task was claimed again and again. (Logging is off meanwhile:
    pytest-xdist cannot send a captured log line holding a lone surrogate to its parent.)"""
    logging.disable(logging.CRITICAL)
    try:
        _fail(store, {"message": "file {lone}.csv unreadable"})
    finally:
        logging.disable(logging.NOTSET)

    record = backend.open().get_task("t1")
    assert record.state is TaskState.TERMINAL
    assert record.reason is not None and "file \\udc80.csv unreadable" in record.reason
    assert "file \\udc80.csv unreadable" in _failed_detail(backend)["reason"]


def test_a_failure_recorded_with_a_traceback_keeps_it_beside_the_error(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t2"))
    (claimed,) = store.claim(WorkerId.parse("worker-1"), LEASE)
    trace = 'Traceback (most recent call last):\n  File "app.py", line 3, in charge\nValueError: declined\n'
    error = FailureDetail("ValueError", "declined", "t2", "charge", None, traceback=trace)
    store.fail(claimed.lease, claimed.revision, None, reason="step 'charge' raised", error=error)
    assert store.history("t2")[-1].detail == {
        "reason": "step 'charge' raised",
        "error_class": "ValueError",
        "step_id": "charge",
        "effect_key": None,
        "traceback": trace,
    }
