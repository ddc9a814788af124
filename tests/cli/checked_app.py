"""A registry for the tests of checked enqueue and signals through the CLI:
``APP = "tests.cli.checked_app:registry"``. ``invoice`` takes an attrs input and waits for
a receipt, then for an approval by ``manager``."""

from __future__ import annotations

from typing import Any

import attrs

from runifold_sync import Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry


@attrs.frozen
class Line:
    sku: str
    qty: int


@attrs.frozen
class Invoice:
    invoice_id: int
    lines: list[Line]


invoice = Workflow("invoice", 1, signals=["receipt", "approval"])


@invoice.main
def run(ctx: WorkflowContext, order: Invoice) -> dict[str, Any]:
    ctx.wait_for_signal("receipt")
    decision = ctx.request_approval("approval", approvers=["manager"])
    return {"invoice": order.invoice_id, "decision": attrs.asdict(decision)}


refund = Workflow("refund", 1)


@refund.main
def run_refund(ctx: WorkflowContext, amount: int) -> int:
    return amount


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(invoice))
registry.register(WorkflowDefinition(refund))
