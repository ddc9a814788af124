"""The fan-out workflow of the child tests: ``fanout`` starts one ``leaf`` child per
item of its input and waits for them all; each ``leaf`` runs one step that appends
``<task> <pid>`` to the ledger ``FANOUT_LEDGER`` names (so a test counts the bodies that
really ran) and returns its item doubled. Served to a pool with
``python -m runifold_sync run --app tests.system.fanout_app:registry``."""

from __future__ import annotations

import os
import time

from runifold_sync import Budget, StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry
from tests.support import ledger

LEDGER_ENV = "FANOUT_LEDGER"
STEP_S = 0.02  # long enough that a kill often lands inside a body

fanout = Workflow("fanout", 1)
leaf = Workflow("leaf", 1)


@fanout.main
def fanout_main(ctx: WorkflowContext, items: list[int]) -> int:
    handles = [ctx.start_child("leaf", 1, item) for item in items]
    results = ctx.wait_children(handles, result_type=int)
    assert isinstance(results, list)
    return sum(results)


@leaf.step()
def double(ctx: StepContext, item: int) -> int:
    ledger.append(os.environ[LEDGER_ENV], ctx.task_id, os.getpid(), durable=False)
    time.sleep(STEP_S)
    return 2 * item


@leaf.main
def leaf_main(ctx: WorkflowContext, item: int) -> int:
    return double(ctx, item)


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    # A killed worker's claim counts as an attempt without progress: leave room for kills.
    reg.register(WorkflowDefinition(fanout, Budget(max_attempts=20)))
    reg.register(WorkflowDefinition(leaf, Budget(max_attempts=20)))
    return reg
