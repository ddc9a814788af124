"""The order workflow the Flask example runs, and the registry workers load
(``RUNIFOLD_APP = "order_flow:registry"``)."""

from __future__ import annotations

import attrs

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry

order_intake = Workflow("order-intake", 1)


@attrs.frozen
class Order:
    order_id: str
    sku: str
    quantity: int


@order_intake.step()
def reserve_stock(ctx: StepContext, sku: str, quantity: int) -> str:
    return f"reservation-{sku}-{quantity}"


@order_intake.effect(idempotent=True)
def send_confirmation(ctx: StepContext, order_id: str, reservation: str) -> str:
    print(f"order {order_id}: confirmed with {reservation}", flush=True)  # a real app sends mail here
    return f"confirmation-{order_id}"


@order_intake.main
def run(ctx: WorkflowContext, order: Order) -> dict[str, str]:
    if order.quantity < 1:
        raise ValueError(f"order {order.order_id}: quantity must be at least 1, got {order.quantity}")
    reservation = reserve_stock(ctx, order.sku, order.quantity)
    confirmation = send_confirmation(ctx, order.order_id, reservation)
    return {"reservation": reservation, "confirmation": confirmation}


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(order_intake))
