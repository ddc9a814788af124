"""A registry whose one workflow ends a ``run --once`` cycle with the outcome its input
names, for the exit-status tests: ``APP = "tests.cli.outcome_app:registry"``.

``lose_lease`` moves the store's clock (kept in the database, read from the URL in
``OUTCOME_DATABASE_URL``) an hour ahead while its step runs, so the step's checkpoint
commit finds the lease expired: the worker really loses it. ``charge`` runs an effect
that is neither idempotent nor reconcilable, so a worker killed inside it leaves the task
failed on an ambiguous effect, for ``resolve``.
"""

from __future__ import annotations

import os
from datetime import timedelta

from runifold_sync import (
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    open_store,
)

outcome_flow = Workflow("outcome-flow", 1)


@outcome_flow.step()
def done(ctx: StepContext, mode: str) -> str:
    return mode


@outcome_flow.step(retry=RetryPolicy(max_attempts=2))
def flaky(ctx: StepContext, mode: str) -> str:
    raise RuntimeError("downstream timed out")


@outcome_flow.step(retry=RetryPolicy(max_attempts=1))
def broken(ctx: StepContext, mode: str) -> str:
    raise RuntimeError("bad data")


@outcome_flow.step()
def outlive_lease(ctx: StepContext, mode: str) -> str:
    store = open_store(os.environ["OUTCOME_DATABASE_URL"])
    try:
        store.set_clock_offset(timedelta(hours=1))
    finally:
        store.close()
    return mode


@outcome_flow.effect(idempotent=False)  # no reconciler: an interrupted charge is ambiguous
def charge(ctx: StepContext, mode: str) -> str:
    return "ch-from-body"


@outcome_flow.main
def run(ctx: WorkflowContext, mode: str) -> str:
    if mode == "suspend":
        done(ctx, "before the timer")
        ctx.sleep(timedelta(hours=1))
    elif mode == "retry":
        flaky(ctx, mode)
    elif mode == "fail":
        broken(ctx, mode)
    elif mode == "lose_lease":
        outlive_lease(ctx, mode)
    elif mode == "charge":
        return charge(ctx, mode)
    return done(ctx, mode)


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(outcome_flow))
