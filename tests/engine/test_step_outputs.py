"""A step's or effect's output against its return annotation: an annotation that admits
every JSON value takes it as it is, and any other holds a new output to it as strictly as
a task's input is held to the main function's (``inputs.py``). One that does not fit
fails the task at once, not retried, naming the step, the annotation and the value,
instead of reaching the main function coerced. What a journal recorded replays through
the codec's converter as before (``test_inputs.py``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    EffectEvidence,
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowTask,
)
from runifold_sync.outcomes import Completed, Failed
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome
from tests.support.backends import sqlite_clock
from tests.support.clock import Clock
from tests.support.journals import entries
from tests.support.workers import WorkerFactory

# The in-process worker tests move the clock of ``sqlite_store``.
clock = sqlite_clock

CALLS: list[str] = []
JSON = str | int | float | bool | None | list[Any] | dict[str, Any]


@attrs.frozen
class Point:
    x: int
    y: int


def _flow(output_type: Any, value: Any, *, effect: bool = False, **options: Any) -> Workflow:
    """Workflow "outputs" whose one step (or effect) ``produce`` returns ``value`` and is
    annotated ``output_type``; its main function returns what it got and that value's
    Python type, so a coercion shows."""
    flow = Workflow("outputs", 1)

    def produce(ctx: StepContext) -> Any:
        CALLS.append(ctx.call_id)
        return value

    produce.__annotations__["return"] = output_type
    if effect:
        declared = flow.effect(effect_id="produce", idempotent=False, **options)(produce)
    else:
        declared = flow.step(step_id="produce", **options)(produce)

    @flow.main
    def main(ctx: WorkflowContext, _input: None) -> Any:
        got = declared(ctx)
        return {"got": got, "type": type(got).__name__}

    return flow


def _run(sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, flow: Workflow) -> Any:
    CALLS.clear()
    sqlite_store.enqueue(WorkflowTask.new("outputs", 1, None, checkpoint_id="t1"))
    return make_worker(WorkflowDefinition(flow)).run_once()


@pytest.mark.parametrize("output_type", [object, Any, object | None, JSON], ids=repr)
@pytest.mark.parametrize("value", ["ok", 42, 1.5, None, [1, "a"], {"k": [True, None]}], ids=repr)
def test_an_annotation_that_admits_every_json_value_takes_the_value_as_it_is(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, output_type: Any, value: Any
) -> None:
    outcome = _run(sqlite_store, make_worker, _flow(output_type, value))

    assert outcome == Completed("t1", {"got": value, "type": type(value).__name__})


@pytest.mark.parametrize(
    ("output_type", "value", "result"),
    [
        (str, "ok", "ok"),
        (float, 2, 2.0),  # JSON has one kind of number: an integer is a float's value
        (list[int], [1, 2], [1, 2]),
        (Point, Point(1, 2), {"x": 1, "y": 2}),
        (int | None, None, None),
        (type(None), None, None),
    ],
    ids=repr,
)
def test_an_output_that_fits_its_annotation_reaches_the_main_function(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, output_type: Any, value: Any, result: Any
) -> None:
    outcome = _run(sqlite_store, make_worker, _flow(output_type, value))

    assert isinstance(outcome, Completed) and outcome.result["got"] == result


@pytest.mark.parametrize(
    ("output_type", "value", "named"),
    [
        (
            str,
            42,
            "step 'produce' returned 42, which does not fit its return annotation str: "
            "output: expected a string, got the number 42",
        ),
        (
            int,
            "7",
            "returned '7', which does not fit its return annotation int: "
            "output: expected an integer, got the string '7'",
        ),
        (int, True, "output: expected an integer, got true"),
        (list[int], [1, "2"], "output[1]: expected an integer, got the string '2'"),
        (Point, {"x": 1, "y": 2, "z": 3}, "output: extra fields found (z)"),
        (type(None), 5, "output: expected null, got the number 5"),
    ],
    ids=repr,
)
def test_a_step_whose_output_does_not_fit_fails_the_task_at_once_naming_it(
    sqlite_store: SqliteWorkflowStore,
    make_worker: WorkerFactory,
    output_type: Any,
    value: Any,
    named: str,
) -> None:
    retry = RetryPolicy(max_attempts=3, initial_backoff=timedelta(seconds=1))
    outcome = _run(sqlite_store, make_worker, _flow(output_type, value, retry=retry))

    assert isinstance(outcome, Failed) and outcome.cause == "bad_output"
    assert named in outcome.reason and "not retried: a programming error" in outcome.reason
    assert outcome.error is not None
    assert (outcome.error.error_class, outcome.error.step_id) == ("OutputMismatch", "produce")
    assert CALLS == ["produce#1"]  # not retried, though its policy allows three attempts
    record = sqlite_store.get_task("t1")
    assert record.outcome is TaskOutcome.FAILED and not record.ambiguous_effect
    assert entries(sqlite_store, "t1") == []  # nothing recorded that a replay would coerce


def test_an_effect_whose_output_does_not_fit_is_recorded_as_run_and_fails_the_task(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    outcome = _run(sqlite_store, make_worker, _flow(str, 42, effect=True))

    assert isinstance(outcome, Failed) and outcome.cause == "bad_output"
    assert outcome.reason.startswith(
        "effect 'produce' returned 42, which does not fit its return annotation str: "
        "output: expected a string, got the number 42"
    )
    # It happened, so the journal says so (and with what): never run again on a guess.
    (entry,) = entries(sqlite_store, "t1")
    assert (entry["status"], entry["output"], entry["evidence"]) == ("done", 42, "ran")
    assert CALLS == ["produce#1"]


class _Crash(BaseException):
    """Kills the claim mid-effect, as a worker's death would."""


def test_a_reconciled_result_that_does_not_fit_fails_the_task_naming_where_it_came_from(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    def crash(ctx: StepContext) -> str:
        raise _Crash()

    def found(ctx: StepContext) -> EffectEvidence:
        return EffectEvidence.applied(7)

    flow = Workflow("outputs", 1)
    charge = flow.effect(effect_id="produce", idempotent=False, reconcile=found)(crash)

    @flow.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return charge(ctx)

    sqlite_store.enqueue(WorkflowTask.new("outputs", 1, None, checkpoint_id="t1"))
    worker = make_worker(WorkflowDefinition(flow))
    with pytest.raises(_Crash):
        worker.run_once()
    clock.advance(31)  # the dead claim's lease runs out

    outcome = worker.run_once()

    assert isinstance(outcome, Failed) and outcome.cause == "bad_output"
    assert outcome.reason.startswith(
        "effect 'produce' was reconciled as applied with the result 7, which does not fit its "
        "return annotation str"
    )
