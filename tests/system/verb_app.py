"""The workflow of the crash-point cases of the workflow verbs (issue 48), and a worker
process for it.

    RUNIFOLD_CRASH_AT=point[:subject] python -m tests.system.verb_app --url URL --ledger PATH --task T

``verbs`` reads ``ctx.now()`` and hands it to a step (``stamp``), calls a step that always
fails on its one attempt (``doomed``), catches its ``StepFailed`` and runs a fallback
(``fallback``), then runs a long step (``crunch``) that reports progress with
``heartbeat`` after each item, resumes from the last details a crashed attempt left
(``last_heartbeat``), and publishes an event from its body when done. Each body appends
``<body> <task> <pid> <detail>`` to the ledger, so the test counts what really ran and
sees what each received.

``cleanup`` holds a room (``hold``, whose body cancels its own task, as an operator
would while it runs; its compensation ``unhold`` takes the step's arguments), then calls
``work`` in a ``try:`` whose ``finally:`` calls ``release``: the cancel reaches the main
function at ``work``'s boundary, and ``release`` runs as the cancel unwinds it.

``anyone`` starts a child (``chore``) and waits for the first of signal ``stop`` and that
child (``ctx.wait_any``), then records which fired in a step (``note``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from runifold_sync import (
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    open_store,
)
from runifold_sync.errors import StepFailed
from tests.support import ledger

from .crash_app import LEDGER_ENV, drive_one_task

flow = Workflow("verbs", 1)
CRUNCH_ITEMS = 4
URL_ENV = "VERB_STORE_URL"  # where hold's body cancels its task


def _record(body: str, ctx: StepContext, detail: object = "-") -> None:
    ledger.append(Path(os.environ[LEDGER_ENV]), body, ctx.task_id, os.getpid(), detail)


@flow.step()
def stamp(ctx: StepContext, at: str) -> str:
    _record("stamp", ctx, at)
    return at


@flow.step(retry=RetryPolicy(max_attempts=1))
def doomed(ctx: StepContext, order: str) -> str:
    _record("doomed", ctx)
    raise RuntimeError(f"no stock for {order}")


@flow.step()
def fallback(ctx: StepContext, failed: str) -> str:
    _record("fallback", ctx)
    return f"backordered after {failed}"


@flow.step()
def crunch(ctx: StepContext, items: int) -> int:
    start = 0 if ctx.last_heartbeat is None else ctx.last_heartbeat["next"]
    _record("crunch", ctx, start)
    for item in range(start, items):
        _record("item", ctx, item)
        ctx.heartbeat({"next": item + 1})
    ctx.set_event("crunched", items)
    return items


@flow.main
def verbs_main(ctx: WorkflowContext, order: str) -> dict[str, Any]:
    at = stamp(ctx, ctx.now().isoformat())
    try:
        doomed(ctx, order)
        plan = "in stock"
    except StepFailed as failed:
        plan = fallback(ctx, failed.error_class)
    return {"at": at, "plan": plan, "crunched": crunch(ctx, CRUNCH_ITEMS)}


cleanup = Workflow("cleanup", 1)


@cleanup.step()
def hold(ctx: StepContext, room: str) -> str:
    _record("hold", ctx)
    store = open_store(os.environ[URL_ENV])
    try:
        store.cancel(ctx.task_id, "ops", "guest left")
    finally:
        store.close()
    return f"held {room}"


@cleanup.compensate_for("hold", with_args=True)
def unhold(ctx: StepContext, held: str, room: str) -> None:
    _record("unhold", ctx, room)


@cleanup.step()
def work(ctx: StepContext, held: str) -> str:
    _record("work", ctx)
    return held


@cleanup.step()
def release(ctx: StepContext, held: str) -> str:
    _record("release", ctx)
    return f"released {held}"


@cleanup.main
def cleanup_main(ctx: WorkflowContext, room: str) -> str:
    held = hold(ctx, room)
    try:
        return work(ctx, held)
    finally:
        release(ctx, held)


chore = Workflow("chore", 1)


@chore.main
def chore_main(ctx: WorkflowContext, order: str) -> str:
    return f"chore {order} done"


anyone = Workflow("anyone", 1, signals=["stop"])


@anyone.step()
def note(ctx: StepContext, fired: int) -> int:
    _record("note", ctx, fired)
    return fired


@anyone.main
def anyone_main(ctx: WorkflowContext, order: str) -> dict[str, Any]:
    child = ctx.start_child("chore", 1, order)
    fired = ctx.wait_any(["stop", child])
    return {"fired": note(ctx, fired.index), "value": fired.value}


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(flow))
    reg.register(WorkflowDefinition(cleanup))
    reg.register(WorkflowDefinition(chore))
    reg.register(WorkflowDefinition(anyone))
    return reg


if __name__ == "__main__":
    sys.exit(drive_one_task("python -m tests.system.verb_app", registry()))
