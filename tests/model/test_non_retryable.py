"""``RetryPolicy.non_retryable``: a step raising one of its classes fails its task at the
first attempt, whatever ``max_attempts`` allows; by default that is the programming
errors (``TypeError``, ``AttributeError``, ``NameError``), and ``non_retryable=()``
retries everything. A bad value is refused where it is given, naming it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowTask,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.outcomes import Failed, Retried, RunOutcome
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.support.workers import WorkerFactory

THREE = {"max_attempts": 3, "initial_backoff": timedelta(seconds=1), "jitter": 0.0}


# --- the policy's value ----------------------------------------------------------------------


def test_the_default_policy_does_not_retry_programming_errors() -> None:
    assert RetryPolicy().non_retryable == (TypeError, AttributeError, NameError)
    assert RetryPolicy.PROGRAMMING_ERRORS == RetryPolicy().non_retryable


def test_non_retryable_takes_any_iterable_of_exception_classes_as_a_tuple() -> None:
    assert RetryPolicy(non_retryable=[ValueError, KeyError]).non_retryable == (ValueError, KeyError)
    assert RetryPolicy(non_retryable=()).non_retryable == ()
    assert (
        RetryPolicy(non_retryable=(*RetryPolicy.PROGRAMMING_ERRORS, ValueError)).non_retryable[-1]
        is ValueError
    )


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        (TypeError, ["must be a tuple of exception classes", "<class 'TypeError'>", "write (TypeError,)"]),
        ("TypeError", ["must be a tuple of exception classes", "'TypeError'"]),
        (42, ["must be a tuple of exception classes", "42"]),
        (None, ["must be a tuple of exception classes", "None"]),
        ((TypeError, "ValueError"), ["must hold exception classes", "'ValueError' at position 1"]),
        ((int,), ["must hold exception classes", "<class 'int'> at position 0"]),
        ((ValueError(),), ["must hold exception classes", "ValueError() at position 0"]),
        ((KeyboardInterrupt,), ["only subclasses of Exception", "KeyboardInterrupt at position 0"]),
    ],
)
def test_a_non_retryable_that_is_not_exception_classes_is_refused_naming_it(
    value: Any, fragments: list[str]
) -> None:
    with pytest.raises(InvalidArgument) as info:
        RetryPolicy(non_retryable=value)
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert message.startswith("RetryPolicy.non_retryable ")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# --- what a worker does with it ----------------------------------------------------------------


def _run_failing_step(
    store: SqliteWorkflowStore, make_worker: WorkerFactory, body: Callable[[], object], retry: RetryPolicy
) -> tuple[RunOutcome, list[int]]:
    """One cycle of a task whose only step calls ``body``; the attempts its body saw."""
    wf = Workflow("failing", 1)
    attempts: list[int] = []

    @wf.step(retry=retry)
    def work(ctx: StepContext) -> None:
        attempts.append(ctx.attempt)
        body()

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        work(ctx)

    store.enqueue(WorkflowTask.new("failing", 1, None, checkpoint_id="t1"))
    return make_worker(WorkflowDefinition(wf)).run_once(), attempts


def _wrong_arguments() -> object:
    return len(1, 2)  # type: ignore[call-arg]


def _missing_attribute() -> object:
    return None.upper()  # type: ignore[attr-defined]


def _undefined_name() -> object:
    return undefined_helper()  # type: ignore[name-defined]  # noqa: F821


@pytest.mark.parametrize(
    ("mistake", "error_class"),
    [(_wrong_arguments, "TypeError"), (_missing_attribute, "AttributeError"), (_undefined_name, "NameError")],
)
def test_a_programming_error_fails_its_task_at_the_first_attempt(
    sqlite_store: SqliteWorkflowStore,
    make_worker: WorkerFactory,
    mistake: Callable[[], object],
    error_class: str,
) -> None:
    outcome, attempts = _run_failing_step(sqlite_store, make_worker, mistake, RetryPolicy(**THREE))

    assert isinstance(outcome, Failed), outcome
    assert attempts == [1]  # three attempts allowed, one made
    assert outcome.cause == "step_error"
    assert outcome.error is not None and outcome.error.error_class == error_class
    assert outcome.reason.startswith(f"step 'work' raised {error_class}: ")
    assert outcome.reason.endswith(
        f"; not retried: {error_class} is non-retryable (RetryPolicy.non_retryable)"
    )
    assert sqlite_store.get_task("t1").state.value == "terminal"


def test_a_subclass_of_a_non_retryable_class_is_not_retried_either(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    def unbound() -> object:
        if False:
            value = 1
        return value  # UnboundLocalError, a NameError

    outcome, attempts = _run_failing_step(sqlite_store, make_worker, unbound, RetryPolicy(**THREE))

    assert isinstance(outcome, Failed) and attempts == [1]
    assert outcome.error is not None and outcome.error.error_class == "UnboundLocalError"


def test_an_empty_non_retryable_retries_a_type_error_like_any_other(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    outcome, attempts = _run_failing_step(
        sqlite_store, make_worker, _wrong_arguments, RetryPolicy(**THREE, non_retryable=())
    )

    assert isinstance(outcome, Retried), outcome
    assert attempts == [1]
    assert outcome.reason.startswith("step 'work' raised TypeError: ")
    assert outcome.reason.endswith("(attempt 1 of 3)")


def test_a_class_the_application_names_is_not_retried_and_others_still_are(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    policy = RetryPolicy(**THREE, non_retryable=(PermissionError,))

    def refused() -> object:
        raise PermissionError("account closed")

    outcome, attempts = _run_failing_step(sqlite_store, make_worker, refused, policy)
    assert isinstance(outcome, Failed) and attempts == [1]
    assert outcome.reason == (
        "step 'work' raised PermissionError: account closed; not retried: PermissionError is "
        "non-retryable (RetryPolicy.non_retryable)"
    )


def test_a_transient_error_is_still_retried_by_the_default_policy(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    def timed_out() -> object:
        raise ConnectionError("upstream timed out")

    outcome, _ = _run_failing_step(sqlite_store, make_worker, timed_out, RetryPolicy(**THREE))
    assert isinstance(outcome, Retried), outcome


def test_an_effect_raising_a_programming_error_fails_at_once_naming_its_key(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = Workflow("failing-effect", 1)
    calls: list[int] = []

    @wf.effect(idempotent=False, retry=RetryPolicy(**THREE))
    def charge(ctx: StepContext) -> str:
        calls.append(ctx.attempt)
        return "ch_" + 1  # type: ignore[operator]

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return charge(ctx)

    sqlite_store.enqueue(WorkflowTask.new("failing-effect", 1, None, checkpoint_id="e1"))
    outcome = make_worker(WorkflowDefinition(wf)).run_once()

    assert isinstance(outcome, Failed) and calls == [1]
    assert outcome.error is not None
    assert (outcome.error.error_class, outcome.error.effect_key) == ("TypeError", "e1/charge#1")
    assert not outcome.recoverable  # it raised: it did not happen halfway
