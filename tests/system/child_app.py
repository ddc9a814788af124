"""The parent and child workflows of the child crash-point cases, and a worker process
that runs them.

    RUNIFOLD_CRASH_AT=point[:subject] python -m tests.system.child_app --url URL --ledger PATH

``family`` runs ``prepare``, starts one ``kid`` child, waits for it and runs ``finish``;
``kid`` runs ``work``. Each body appends ``<body> <task> <pid>`` to the ledger (as
``crash_app`` does), so the test counts what really ran. The process runs cycles until the
parent ends or nothing was claimable for a while; with a crash point armed it is expected
to die of SIGKILL on the way.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runifold_sync import (
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)
from tests.support import ledger

from .crash_app import LEDGER_ENV, drive_one_task

BODIES = ("prepare", "work", "finish")

parent = Workflow("family", 1)
kid = Workflow("kid", 1)


def _record(body: str, ctx: StepContext) -> None:
    ledger.append(Path(os.environ[LEDGER_ENV]), body, ctx.task_id, os.getpid())


@parent.step()
def prepare(ctx: StepContext, order: str) -> str:
    _record("prepare", ctx)
    return f"prepared {order}"


@parent.step()
def finish(ctx: StepContext, worked: str) -> str:
    _record("finish", ctx)
    return f"finished after {worked}"


@parent.main
def family_main(ctx: WorkflowContext, order: str) -> str:
    handle = ctx.start_child("kid", 1, prepare(ctx, order))
    return finish(ctx, ctx.wait_child(handle, result_type=str))


@kid.step()
def work(ctx: StepContext, what: str) -> str:
    _record("work", ctx)
    return f"worked on {what}"


@kid.main
def kid_main(ctx: WorkflowContext, what: str) -> str:
    return work(ctx, what)


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(parent))
    reg.register(WorkflowDefinition(kid))
    return reg


if __name__ == "__main__":
    sys.exit(drive_one_task("python -m tests.system.child_app", registry()))
