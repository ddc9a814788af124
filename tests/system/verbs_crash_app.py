"""The workflow of the verbs' crash cases (``test_attribute_stream_update_crash_points``) and a worker
process that runs it:

    RUNIFOLD_CRASH_AT=point[:subject] python -m tests.system.verbs_crash_app \\
        --url URL --ledger PATH --task TASK

``verbs`` runs a step (which writes to stream ``steps`` from its body), sets search
attributes (``ctx.set_attributes``), writes a stream value (``ctx.write_stream``), starts a
detached child (``verbs-audit``, ``ctx.start_child(..., detached=True)``), waits for an
update ``add`` (the test sends ``u0``, which the validator rejects, then ``u1``) and
replies to it, runs a second step, and returns. Each step body appends ``<step> <task>
<pid>`` to the ledger, so the test counts what really ran.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry
from runifold_sync.workflow.waiting import Update
from tests.support import ledger

from .crash_app import drive_one_task

LEDGER_ENV = "VERBS_CRASH_LEDGER"
BODIES = ("prepare", "finish")

flow = Workflow("verbs", 1, signals=["add"])


@flow.validator("add")
def check_add(payload: dict[str, int]) -> None:
    if payload["quantity"] <= 0:
        raise ValueError("quantity must be positive")


def _record(step: str, ctx: StepContext) -> None:
    ledger.append(Path(os.environ[LEDGER_ENV]), step, ctx.task_id, os.getpid())


@flow.step()
def prepare(ctx: StepContext, order: str) -> str:
    _record("prepare", ctx)
    ctx.write_stream("steps", "preparing")  # from the body, apart from any commit
    return f"prepared {order}"


@flow.step()
def finish(ctx: StepContext, prepared: str) -> str:
    _record("finish", ctx)
    return "done"


@flow.main
def verbs_main(ctx: WorkflowContext, order: str) -> str:
    prepared = prepare(ctx, order)
    ctx.set_attributes(customer=order, stage="prepared")
    ctx.write_stream("progress", prepared)
    ctx.start_child("verbs-audit", 1, order, detached=True)
    update = ctx.wait_for_update("add", payload_type=dict[str, int])
    assert isinstance(update, Update)
    ctx.reply(update, {"added": update.payload["quantity"]})
    return finish(ctx, prepared)


audit = Workflow("verbs-audit", 1)


@audit.main
def audit_main(ctx: WorkflowContext, order: str) -> str:
    return f"audited {order}"


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(flow))
    reg.register(WorkflowDefinition(audit))
    return reg


if __name__ == "__main__":
    sys.exit(drive_one_task("python -m tests.system.verbs_crash_app", registry(), LEDGER_ENV))
