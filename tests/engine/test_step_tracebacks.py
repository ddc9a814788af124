"""A failing step leaves its traceback: logged at warning level with the task's fields at
each failed attempt, and kept, bounded to the newest 4 KiB, in the failure's record
(``Failed.error.traceback``) and its ``failed`` history event."""

from __future__ import annotations

import logging
import traceback
from datetime import timedelta

import pytest

from runifold_sync import (
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowTask,
)
from runifold_sync.engine.logs import FIELDS
from runifold_sync.model.tracebacks import MAX_PIECE_BYTES, MAX_TRACEBACK_BYTES, kept_traceback
from runifold_sync.outcomes import Failed, FailureDetail
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.support.backends import sqlite_clock
from tests.support.clock import Clock
from tests.support.workers import WorkerFactory

# The in-process worker tests move the clock of ``sqlite_store``.
clock = sqlite_clock


def _raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as exc:
        return exc


def _deep(depth: int) -> Exception:
    """An error raised ``depth`` frames down, alternating two functions so that
    Python does not fold the frames into one "repeated" line."""

    def even(n: int) -> None:
        if n == 0:
            raise LookupError("bottom of the stack")
        odd(n - 1)

    def odd(n: int) -> None:
        even(n - 1)

    try:
        even(depth)
    except LookupError as exc:
        return exc
    raise AssertionError("unreachable")


# --- what is kept ----------------------------------------------------------------------------


def test_a_short_traceback_is_kept_whole() -> None:
    error = _raised(KeyError("sku-9"))
    assert kept_traceback(error) == "".join(traceback.format_exception(error))


def test_an_error_that_was_never_raised_keeps_no_traceback() -> None:
    assert kept_traceback(ValueError("built, not raised")) is None


def test_a_deep_traceback_keeps_its_newest_frames_within_the_bound() -> None:
    error = _deep(400)
    whole = "".join(traceback.format_exception(error))
    assert len(whole.encode()) > 4 * MAX_TRACEBACK_BYTES
    kept = kept_traceback(error)

    assert kept is not None and len(kept.encode()) <= MAX_TRACEBACK_BYTES
    first, rest = kept.split("\n", 1)
    cut = len(whole.splitlines()) - len(rest.splitlines())
    assert first == f"[{cut} earlier lines of this traceback cut]"
    assert whole.endswith(rest)  # the newest part, as it was
    assert 'raise LookupError("bottom of the stack")' in rest
    assert rest.endswith("LookupError: bottom of the stack\n")


def test_a_huge_exception_message_is_cut_and_the_frames_stay() -> None:
    error = _raised(ValueError("x" * 100_000))
    kept = kept_traceback(error)

    assert kept is not None and len(kept.encode()) <= MAX_TRACEBACK_BYTES
    assert kept.startswith("Traceback (most recent call last):\n")
    assert "in _raised\n" in kept and "raise error\n" in kept
    last = kept.splitlines(keepends=True)[-1]
    assert last.startswith("ValueError: xxx") and last.endswith(" [... cut]\n")
    assert len(last.encode()) <= MAX_PIECE_BYTES


def test_the_causes_of_an_error_are_kept_with_it() -> None:
    try:
        try:
            raise OSError("disk full")
        except OSError as inner:
            raise RuntimeError("could not write the report") from inner
    except RuntimeError as exc:
        kept = kept_traceback(exc)
    assert kept is not None
    assert "OSError: disk full" in kept
    assert "The above exception was the direct cause of the following exception" in kept
    assert kept.endswith("RuntimeError: could not write the report\n")


def test_characters_no_store_can_keep_are_written_as_escapes() -> None:
    kept = kept_traceback(_raised(ValueError("nul \x00 and lone \ud800 here")))
    assert kept is not None
    assert kept.endswith("ValueError: nul \\x00 and lone \\ud800 here\n")
    kept.encode("utf-8")  # no lone surrogate left


# --- what a worker does -----------------------------------------------------------------------


def _failing_workflow(retry: RetryPolicy) -> Workflow:
    wf = Workflow("traced", 1)

    def parse_sku(raw: str) -> int:
        return int(raw.removeprefix("sku-"))

    @wf.step(retry=retry)
    def reserve(ctx: StepContext, raw: str) -> int:
        return parse_sku(raw)

    @wf.main
    def main(ctx: WorkflowContext, raw: str) -> int:
        return reserve(ctx, raw)

    return wf


def test_every_failed_attempt_logs_its_traceback_at_warning_with_the_task_fields(
    sqlite_store: SqliteWorkflowStore,
    make_worker: WorkerFactory,
    clock: Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="runifold_sync")
    retry = RetryPolicy(max_attempts=2, initial_backoff=timedelta(seconds=1), jitter=0.0)
    worker = make_worker(WorkflowDefinition(_failing_workflow(retry)), worker_id="w7")
    sqlite_store.enqueue(WorkflowTask.new("traced", 1, "sku-x", checkpoint_id="t1"))

    assert worker.run_once().kind == "retried"
    clock.advance(2)
    outcome = worker.run_once()
    assert isinstance(outcome, Failed)

    attempts = [r for r in caplog.records if r.name == "runifold_sync.workflow.context"]
    assert [r.levelno for r in attempts] == [logging.WARNING, logging.WARNING]
    assert [r.getMessage() for r in attempts] == [
        "step 'reserve' raised ValueError: invalid literal for int() with base 10: 'x' (attempt 1 of 2)",
        outcome.reason,
    ]
    for token, record in enumerate(attempts, start=1):
        assert {name: getattr(record, name) for name in FIELDS} == {
            "task_id": "t1",
            "worker_id": "w7",
            "fencing_token": token,
        }
        assert record.exc_info is not None and isinstance(record.exc_info[1], ValueError)
        logged = logging.Formatter().formatException(record.exc_info)
        assert "in parse_sku\n" in logged and "return int(raw.removeprefix(" in logged
    # The task's failure is one error line; the traceback it would repeat was logged above.
    (failed,) = [r for r in caplog.records if r.getMessage().startswith("task failed")]
    assert failed.levelno == logging.ERROR and failed.exc_info is None


def test_the_failure_record_and_its_event_keep_the_steps_traceback(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_failing_workflow(RetryPolicy(max_attempts=1))))
    sqlite_store.enqueue(WorkflowTask.new("traced", 1, "sku-x", checkpoint_id="t1"))

    outcome = worker.run_once()

    assert isinstance(outcome, Failed) and outcome.error is not None
    kept = outcome.error.traceback
    assert kept is not None
    assert kept.startswith("Traceback (most recent call last):\n")
    assert "in reserve\n" in kept and "in parse_sku\n" in kept
    assert kept.endswith("ValueError: invalid literal for int() with base 10: 'x'\n")
    event = sqlite_store.history("t1")[-1]
    assert event.kind == "failed" and event.detail["traceback"] == kept


def test_a_main_function_that_raises_logs_its_traceback_with_the_failure(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="runifold_sync")
    wf = Workflow("main-raises", 1)

    @wf.main
    def main(ctx: WorkflowContext, order: dict[str, str]) -> str:
        return order["customer"]

    sqlite_store.enqueue(WorkflowTask.new("main-raises", 1, {}, checkpoint_id="m1"))
    outcome = make_worker(WorkflowDefinition(wf)).run_once()

    assert isinstance(outcome, Failed) and outcome.cause == "workflow_error"
    assert outcome.error is not None and outcome.error.traceback is not None
    assert outcome.error.traceback.endswith("KeyError: 'customer'\n")
    (failed,) = [r for r in caplog.records if r.getMessage().startswith("task failed")]
    assert failed.exc_info is not None and isinstance(failed.exc_info[1], KeyError)
    assert failed.__dict__["task_id"] == "m1"


def test_a_traceback_does_not_make_two_failures_of_one_error_unequal() -> None:
    with_trace = FailureDetail("ValueError", "bad", "t1", "reserve", None, traceback="Traceback ...\n")
    assert with_trace == FailureDetail("ValueError", "bad", "t1", "reserve", None)
    assert "Traceback" not in repr(with_trace)  # one line in a repr; the logs and show print it
