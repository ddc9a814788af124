"""An expense-approval workflow and a one-shot worker process that runs it.

    python -m tests.system.approval_app --database URL --worker-id ID \
        [--lease-s X] [--heartbeat-s Y]

The process opens its own store, runs ``run_once()`` once and prints the outcome as one
JSON line on stdout. Only ``manager`` may decide the approval; anyone else's decision is
refused by the workflow and kept in the task's history.
"""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import Any

import attrs

from runifold_sync import (
    ApprovalTimedOut,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)

from .one_cycle import run_one_cycle

APPROVERS = ("manager",)


@attrs.frozen
class ExpenseClaim:
    claim_id: str
    amount: int


expense = Workflow("expense", 1, signals=["approval"])


@expense.step()
def submit(ctx: StepContext, claim: ExpenseClaim) -> str:
    return f"submitted {claim.claim_id} for {claim.amount}"


@expense.step()
def book(ctx: StepContext, claim_id: str, approved: bool) -> str:
    return f"booked {claim_id}" if approved else f"returned {claim_id}"


@expense.main
def expense_main(ctx: WorkflowContext, claim: ExpenseClaim) -> dict[str, Any]:
    submitted = submit(ctx, claim)
    decision = ctx.request_approval("approval", approvers=APPROVERS)
    if isinstance(decision, ApprovalTimedOut):  # no timeout is set; kept for completeness
        return {"submitted": submitted, "timed_out": True}
    return {
        "submitted": submitted,
        "approver": decision.approver,
        "approved": decision.approved,
        "reason": decision.reason,
        "booked": book(ctx, claim.claim_id, decision.approved),
    }


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(expense))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True, help="store URL")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--lease-s", type=float, default=10.0)
    parser.add_argument("--heartbeat-s", type=float, default=2.0)
    args = parser.parse_args(argv)

    return run_one_cycle(
        args.database,
        registry,
        args.worker_id,
        timedelta(seconds=args.lease_s),
        timedelta(seconds=args.heartbeat_s),
    )


if __name__ == "__main__":
    sys.exit(main())
