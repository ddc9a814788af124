"""The strict structuring of workflow inputs (``runifold_sync.model.inputs``) and what it leaves
alone: step outputs recorded in checkpoints replay through the codec's converter as they
always did, coercions included."""

from __future__ import annotations

from collections.abc import Sequence, Set
from typing import Any

import pytest

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowTask
from runifold_sync.errors import InputMismatch
from runifold_sync.model.inputs import fit_input
from runifold_sync.outcomes import Completed, Suspended
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.support.workers import WorkerFactory


@pytest.mark.parametrize(
    ("raw", "type_", "value"),
    [
        ({"1": "a", "2": "b"}, dict[int, str], {1: "a", 2: "b"}),  # JSON keys are text
        ([1, "a"], tuple[int, str], (1, "a")),
        ([1, 2], tuple[int, ...], (1, 2)),
        ([1, 2], Sequence[int], (1, 2)),
        ([1, 1], Set[int], frozenset({1})),
        ([1, 1], set[int], {1}),
        (3, float, 3.0),
        ("x", Any, "x"),
        (None, int | None, None),
    ],
)
def test_json_values_of_the_annotated_kind_are_structured(raw: Any, type_: Any, value: Any) -> None:
    assert fit_input(raw, type_, coerce=False) == value


@pytest.mark.parametrize(
    ("raw", "type_", "problem"),
    [
        ({"x": "a"}, dict[int, str], "input['x']: invalid value for type, expected int"),
        ({"a": "1"}, dict[str, int], "input['a']: expected an integer, got the string '1'"),
        ([1], tuple[int, str], "input: expected an array of 2, got an array of 1"),
        ([1, 2], tuple[int, str], "input[1]: expected a string, got the number 2"),
        ({"a": 1}, list[int], "input: expected an array, got an object"),
        ("1.5", float, "input: expected a number, got the string '1.5'"),
        (1, bool, "input: expected true or false, got the number 1"),
        (["a"], dict[str, str], "input: expected an object, got an array of 1"),
    ],
)
def test_values_of_another_kind_are_refused_naming_the_path(raw: Any, type_: Any, problem: str) -> None:
    with pytest.raises(InputMismatch) as refused:
        fit_input(raw, type_, coerce=False)
    (line,) = refused.value.problems
    assert line.startswith(problem)


def test_coercion_when_asked_for_is_cattrs_own() -> None:
    assert fit_input({"1": "7"}, dict[int, int], coerce=True) == {1: 7}
    assert fit_input(5, str, coerce=True) == "5"


def _lying(output_type: Any) -> Workflow:
    """Workflow "lying-step" whose step ``count`` returns "7" and is annotated
    ``output_type``: the same step graph (fingerprint) whatever the annotation."""
    flow = Workflow("lying-step", 1, signals=["go"])

    def count(ctx: StepContext, _value: None) -> Any:
        return "7"

    count.__annotations__["return"] = output_type
    step = flow.step(step_id="count")(count)

    @flow.main
    def lying_main(ctx: WorkflowContext, _value: None) -> int:
        total = step(ctx, None)
        ctx.wait_for_signal("go")
        return int(total + 1)

    return flow


def test_a_recorded_step_output_replays_through_the_codecs_converter_unchanged(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    recorder, current = _lying(Any), _lying(int)  # the step's annotation was changed since
    assert recorder.fingerprint() == current.fingerprint()
    sqlite_store.enqueue(WorkflowTask.new("lying-step", 1, None, checkpoint_id="t1"))
    assert isinstance(make_worker(WorkflowDefinition(recorder)).run_once(), Suspended)
    sqlite_store.send_signal("t1", "go", None, signal_id="s1", sender="ops")

    worker = make_worker(WorkflowDefinition(current), worker_id="w2")
    assert worker.run_once() == Completed("t1", 8)  # "7" structured back as the annotated int
