"""A registry whose one workflow publishes two events and then waits on a timer, for the
tests of what ``show`` prints of events: ``APP = "tests.cli.events_app:registry"``."""

from __future__ import annotations

from datetime import timedelta

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry

stages = Workflow("stages", 1)


@stages.step()
def pack(ctx: StepContext, order: str) -> str:
    return f"packed {order}"


@stages.main
def run(ctx: WorkflowContext, order: str) -> None:
    ctx.set_event("stage", "packing")
    label = pack(ctx, order)
    ctx.set_event("stage", "packed")
    ctx.set_event("parcel", {"label": label, "kg": 1.5})
    ctx.sleep(timedelta(hours=1))


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(stages))
