"""The workflow the schedule contract tests schedule (``report`` v1, which returns its
tick and input), and a registry of it with given schedules."""

from __future__ import annotations

from runifold_sync import (
    Schedule,
    ScheduleTick,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)

report = Workflow("report", 1)


@report.main
def report_main(ctx: WorkflowContext, run: ScheduleTick) -> dict[str, object]:
    return {"tick": run.tick.isoformat(), "input": run.input}


def report_registry(*schedules: Schedule) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(report))
    for schedule in schedules:
        registry.add_schedule(schedule)
    return registry
