"""``Schedule`` and ``registry.add_schedule``: every bad field is an ``InvalidArgument``
naming it, where the schedule is made; a tick's task id and input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    Schedule,
    ScheduleTick,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)
from runifold_sync.errors import InputMismatch, InvalidArgument, UnknownDefinition
from runifold_sync.model.codec import MAX_NESTING_DEPTH, from_json, to_json
from runifold_sync.model.values import MAX_INPUT_BYTES

report = Workflow("report", 1)


@attrs.frozen
class Report:
    kind: str


@attrs.frozen
class ReportRun:
    schedule: str
    tick: datetime
    input: Report


@report.main
def report_main(ctx: WorkflowContext, run: ReportRun) -> str:
    return run.input.kind


def _registry() -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(report))
    return registry


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"cron": "30 2 * *"}, r"schedule 'nightly': cron '30 2 \* \*' has 4 fields; it needs 5"),
        ({"cron": "0 30 2 * * *"}, "has 6 fields; it needs 5"),
        ({"cron": "61 2 * * *"}, r"cron '61 2 \* \* \*' is invalid: Bad minute"),
        ({"cron": "0 0 31 2 *"}, "is invalid: Bad day-of-month"),
        ({"cron": 5}, "cron must be a string, got 5"),
        (
            {"cron": "30 2 * * *", "timezone": "Europe/Berlinn"},
            "timezone 'Europe/Berlinn' is not in the timezone database",
        ),
        (
            {"cron": "30 2 * * *", "timezone": "../etc/passwd"},
            "timezone '../etc/passwd' is not in the timezone database",
        ),
        ({"cron": "30 2 * * *", "timezone": ""}, "timezone must be a name such as 'Europe/Berlin'"),
        ({}, "needs exactly one of cron= and every=, got cron=None every=None"),
        ({"cron": "30 2 * * *", "every": timedelta(hours=1)}, "needs exactly one of cron= and every="),
        ({"every": timedelta(0)}, "every must be a positive whole number of seconds"),
        ({"every": timedelta(seconds=-5)}, "every must be a positive whole number of seconds"),
        ({"every": timedelta(seconds=1.5)}, "every must be a positive whole number of seconds"),
        ({"every": timedelta(days=4000)}, "up to 3650 days"),
        ({"every": 60}, "every must be a datetime.timedelta, got 60"),
        (
            {"every": timedelta(days=1), "timezone": "Europe/Berlin"},
            "timezone 'Europe/Berlin' applies to cron schedules only",
        ),
        (
            {"every": timedelta(hours=1), "input": {"at": object()}},
            "schedule 'nightly' input .* is not JSON-serializable",
        ),
    ],
)
def test_a_bad_expression_timezone_or_input_is_refused_naming_it(
    arguments: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Schedule("nightly", "report", 1, **arguments)  # type: ignore[arg-type]


def _ticker_registry() -> WorkflowRegistry:
    ticker = Workflow("ticker", 1)

    @ticker.main
    def main(ctx: WorkflowContext, run: ScheduleTick) -> None:
        return None

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(ticker))
    return registry


def test_an_input_too_large_for_its_ticks_tasks_is_refused_at_construction_naming_the_schedule() -> None:
    wrapped = len(to_json({"schedule": "big", "tick": "2026-12-02T03:00:00Z", "input": ""}).encode())
    fitting = "x" * (MAX_INPUT_BYTES - wrapped)  # the tick's task input exactly at the limit
    schedule = Schedule("big", "ticker", 1, every=timedelta(hours=1), input=fitting)
    _ticker_registry().add_schedule(schedule)  # the limit enqueue applies: accepted there too
    with pytest.raises(InvalidArgument) as info:
        Schedule("big", "ticker", 1, every=timedelta(hours=1), input=fitting + "x")
    assert str(info.value) == (
        f"schedule 'big' input makes its ticks' task input {MAX_INPUT_BYTES + 1} bytes encoded, over "
        f"the limit of {MAX_INPUT_BYTES}; store large data outside and pass its id"
    )


def test_an_input_nested_too_deep_for_its_ticks_tasks_is_refused_at_construction_naming_the_schedule() -> (
    None
):
    deepest: list[Any] = []
    for _ in range(MAX_NESTING_DEPTH - 2):
        deepest = [deepest]  # MAX_NESTING_DEPTH - 1 levels; the tick's input adds one
    _ticker_registry().add_schedule(Schedule("deep", "ticker", 1, every=timedelta(hours=1), input=deepest))
    with pytest.raises(
        InvalidArgument, match=f"schedule 'deep' input nests deeper than {MAX_NESTING_DEPTH - 1}"
    ):
        Schedule("deep", "ticker", 1, every=timedelta(hours=1), input=[deepest])


@pytest.mark.parametrize("name", ["", "night:ly", "night/ly", "night ly", "-nightly", "x" * 101, 7, None])
def test_a_name_that_cannot_be_part_of_a_task_id_is_refused(name: object) -> None:
    with pytest.raises(InvalidArgument, match="schedule name must be 1-100 letters, digits and ._-"):
        Schedule(name, "report", 1, every=timedelta(hours=1))  # type: ignore[arg-type]


def test_a_bad_workflow_name_or_version_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="schedule workflow must be non-empty"):
        Schedule("nightly", "", 1, every=timedelta(hours=1))
    with pytest.raises(InvalidArgument, match="version must be an integer in 1.."):
        Schedule("nightly", "report", 0, every=timedelta(hours=1))


def test_add_schedule_needs_the_version_registered_and_input_that_fits_its_main_function() -> None:
    registry = _registry()
    with pytest.raises(UnknownDefinition, match="'report' has no version 2 in this registry, only version 1"):
        registry.add_schedule(Schedule("nightly", "report", 2, every=timedelta(hours=1), input={"kind": "x"}))
    with pytest.raises(UnknownDefinition, match="no workflow named 'reprot' is registered"):
        registry.add_schedule(Schedule("nightly", "reprot", 1, every=timedelta(hours=1), input={"kind": "x"}))
    with pytest.raises(InputMismatch, match=r"input.input: expected an object for Report, got null"):
        registry.add_schedule(Schedule("nightly", "report", 1, every=timedelta(hours=1)))
    with pytest.raises(InvalidArgument, match="expected a Schedule"):
        registry.add_schedule("nightly")  # type: ignore[arg-type]
    nightly = Schedule(
        "nightly", "report", 1, cron="30 2 * * *", timezone="Europe/Berlin", input={"kind": "x"}
    )
    registry.add_schedule(nightly)
    with pytest.raises(InvalidArgument, match="a schedule named 'nightly' is already added"):
        registry.add_schedule(Schedule("nightly", "report", 1, every=timedelta(hours=1), input={"kind": "x"}))
    assert registry.schedules == (nightly,)


def test_a_ticks_task_has_its_time_in_the_id_and_the_input_the_main_function_takes() -> None:
    registry = _registry()
    nightly = Schedule("nightly", "report", 1, cron="0 3 * * *", input=Report("usage"))
    registry.add_schedule(nightly)
    tick = datetime(2026, 12, 2, 3, tzinfo=UTC)
    task = registry.tick_task(nightly, tick)
    assert task.task_id == "schedule:nightly:2026-12-02T03:00:00Z"
    assert (task.definition_name, task.definition_version, task.tenant) == ("report", 1, "default")
    raw = from_json(task.input_json)
    assert raw == {"schedule": "nightly", "tick": "2026-12-02T03:00:00Z", "input": {"kind": "usage"}}
    assert WorkflowDefinition(report).structure_input(raw) == ReportRun("nightly", tick, Report("usage"))
    assert task.declared is not None  # enqueued through the registry, signals and all
    assert task.queue == "default"
    gpu = Schedule("gpu-nightly", "report", 1, cron="0 3 * * *", input=Report("usage"), queue="gpu")
    assert registry.tick_task(gpu, tick).queue == "gpu"
    with pytest.raises(InvalidArgument, match="schedule queue"):
        Schedule("bad", "report", 1, every=timedelta(seconds=1), queue="")


def test_schedule_tick_structures_any_schedules_input() -> None:
    ticker = Workflow("ticker", 1)

    @ticker.main
    def main(ctx: WorkflowContext, run: ScheduleTick) -> str:
        return run.tick.isoformat()

    raw = {"schedule": "s", "tick": "2026-12-02T03:00:00Z", "input": [1, 2]}
    assert WorkflowDefinition(ticker).structure_input(raw) == ScheduleTick(
        "s", datetime(2026, 12, 2, 3, tzinfo=UTC), [1, 2]
    )
