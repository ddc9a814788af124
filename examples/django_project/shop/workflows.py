"""The order workflow (``RUNIFOLD_APP = "shop.workflows:registry"``); its effect writes
through the Django ORM, from the worker process."""

from __future__ import annotations

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry

from .models import Order

order_intake = Workflow("order-intake", 1)


@order_intake.step()
def reserve_stock(ctx: StepContext, order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    return f"reservation-{order.sku}-{order.quantity}"


@order_intake.effect(idempotent=True)  # setting a status twice is harmless
def confirm_order(ctx: StepContext, order_id: int) -> str:
    Order.objects.filter(pk=order_id).update(status="confirmed")
    return "confirmed"


@order_intake.main
def run(ctx: WorkflowContext, order_id: int) -> str:
    reserve_stock(ctx, order_id)
    return confirm_order(ctx, order_id)


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(order_intake))
