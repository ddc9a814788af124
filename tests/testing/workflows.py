"""The workflows the testing kit's tests run: a day's sleep, a signal wait with no
timeout, a step that fails before it succeeds, a parent and its child (on the default
queue or another), timers for ever, a step that charges its tenant's budget.
``ATTEMPTS`` counts the flaky step's calls (reset by the tests' fixture)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from runifold_sync import (
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)

ATTEMPTS: list[int] = []

sleeper = Workflow("sleeper", 1)


@sleeper.step()
def wake(ctx: StepContext, name: str) -> str:
    return f"good morning, {name}"


@sleeper.main
def sleep_a_day(ctx: WorkflowContext, name: str) -> str:
    ctx.sleep(timedelta(days=1))
    return wake(ctx, name)


listener = Workflow("listener", 1, signals=["go"])


@listener.main
def listen(ctx: WorkflowContext, _: None) -> Any:
    return ctx.wait_for_signal("go")


flaky = Workflow("flaky", 1)


@flaky.step(retry=RetryPolicy(max_attempts=3, initial_backoff=timedelta(minutes=10)))
def sometimes(ctx: StepContext) -> int:
    ATTEMPTS.append(len(ATTEMPTS) + 1)
    if len(ATTEMPTS) < 3:
        raise ConnectionError(f"attempt {len(ATTEMPTS)} failed")
    return len(ATTEMPTS)


@flaky.main
def retry_it(ctx: WorkflowContext, _: None) -> int:
    return sometimes(ctx)


parent = Workflow("parent", 1)


@parent.main
def start_and_wait(ctx: WorkflowContext, _: None) -> str:
    handle = ctx.start_child("sleeper", 1, "child")
    result: str = ctx.wait_child(handle, result_type=str)
    return f"child said: {result}"


mail_parent = Workflow("mail-parent", 1)


@mail_parent.main
def start_on_mail_and_wait(ctx: WorkflowContext, _: None) -> str:
    handle = ctx.start_child("sleeper", 1, "mail child", queue="mail")
    result: str = ctx.wait_child(handle, result_type=str)
    return f"child said: {result}"


forever = Workflow("forever", 1)


@forever.main
def tick_for_ever(ctx: WorkflowContext, ticks: int) -> None:
    ctx.sleep(timedelta(hours=1))
    ctx.continue_as_new(ticks + 1)


spender = Workflow("spender", 1)


@spender.step()
def spend(ctx: StepContext, units: float) -> float:
    ctx.charge(units)
    return units


@spender.main
def spend_it(ctx: WorkflowContext, units: float) -> float:
    return spend(ctx, units)


def registry(*workflows: Workflow) -> WorkflowRegistry:
    found = WorkflowRegistry()
    for workflow in workflows:
        found.register(WorkflowDefinition(workflow))
    return found
