"""A workflow whose code is changed under running tasks with ``ctx.patched``, for
``test_patch_pool_restart.py``: ``PATCH_STAGE`` "old" is the release, "patched" adds a
fraud check behind ``ctx.patched("fraud-check")``. Each body appends ``<task> <step>``
to the file ``PATCH_LEDGER``. ``registry`` is what ``run --app`` loads.

    python -m runifold_sync run --app tests.system.patch_app:registry ...
"""

from __future__ import annotations

import os

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry

STAGE = os.environ.get("PATCH_STAGE", "old")
flow = Workflow("patch-flow", 1, signals=["go"])


def _ledger(ctx: StepContext, step: str) -> None:
    with open(os.environ["PATCH_LEDGER"], "a") as ledger:
        ledger.write(f"{ctx.task_id} {step}\n")


@flow.step()
def pack(ctx: StepContext, n: int) -> int:
    _ledger(ctx, "pack")
    return n


@flow.step(patch="fraud-check")
def fraud_check(ctx: StepContext, n: int) -> int:
    _ledger(ctx, "fraud_check")
    return n


@flow.step()
def send(ctx: StepContext, n: int) -> str:
    _ledger(ctx, "send")
    return f"sent {n}"


@flow.main
def main(ctx: WorkflowContext, n: int) -> str:
    packed = pack(ctx, n)
    checked = STAGE == "patched" and ctx.patched("fraud-check")
    if checked:
        packed = fraud_check(ctx, packed)
    ctx.wait_for_signal("go")
    return send(ctx, packed) + (" checked" if checked else "")


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(flow))
