"""The expense workflow of docs/howto/waits-signals-approvals.md: a claim waits up
to 7 days for its receipt, then up to 2 days for alice or bob to approve it, escalated to
carol for 1 more day; approved, it is paid. ``test_expense.py`` runs it to each end with
the testing kit, every wait included, in well under a second."""

from __future__ import annotations

from datetime import timedelta

import attrs

from runifold_sync import (
    ApprovalTimedOut,
    SignalTimedOut,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)

expense = Workflow("expense", version=1, signals=["manager-approval", "receipt"])


@attrs.frozen
class Claim:
    claim_id: str
    amount: float


@expense.step()
def pay(ctx: StepContext, claim: Claim) -> str:
    return f"payment-{claim.claim_id}"  # call the bank with ctx.idempotency_key


@expense.main
def run(ctx: WorkflowContext, claim: Claim) -> dict[str, str]:
    receipt = ctx.wait_for_signal("receipt", timeout=timedelta(days=7))
    if isinstance(receipt, SignalTimedOut):
        return {"status": "no receipt"}
    decision = ctx.request_approval(
        "manager-approval",
        approvers=["alice", "bob"],
        timeout=timedelta(days=2),
        escalate_to=["carol"],
        escalation_timeout=timedelta(days=1),
    )
    if isinstance(decision, ApprovalTimedOut):
        return {"status": "expired"}
    if not decision.approved:
        return {"status": "rejected", "by": decision.approver, "reason": decision.reason or ""}
    return {"status": "paid", "by": decision.approver, "payment": pay(ctx, claim)}


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(expense))
