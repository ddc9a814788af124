"""The expense workflow (``expense.py``) run to each of its ends with the testing kit.

``runifold_store`` and ``runifold_clock`` are the kit's pytest fixtures (installed with
runifold_sync); ``run_until_idle`` runs the claim's task in this process until it waits
for someone, skipping store time over every timeout. Nothing here waits: the whole file
runs in well under a second, days of timeouts included.
"""

from __future__ import annotations

import time
from datetime import timedelta

from expense import registry

from runifold_sync import WorkflowStore
from runifold_sync.outcomes import Completed, Suspended
from runifold_sync.testing import StoreClock, approve, journal, result, run_until_idle, send_signal


def submit(store: WorkflowStore, claim_id: str) -> str:
    task = registry.task("expense", 1, {"claim_id": claim_id, "amount": 42.0}, checkpoint_id=claim_id)
    return store.enqueue(task).task_id


def test_an_approved_claim_is_paid(runifold_store: WorkflowStore) -> None:
    task_id = submit(runifold_store, "c-1")
    # skip_time=False stops at the receipt's wait: skipping would time it out (7 days).
    [waiting] = run_until_idle(runifold_store, registry, skip_time=False)
    assert isinstance(waiting, Suspended) and waiting.reason.startswith("waiting for signal 'receipt'")

    send_signal(runifold_store, task_id, "receipt", {"url": "s3://receipts/c-1.pdf"})
    run_until_idle(runifold_store, registry, skip_time=False)  # now waiting for the approval
    approve(runifold_store, task_id, "manager-approval", approver="alice", reason="fine")
    outcomes = run_until_idle(runifold_store, registry)

    assert outcomes == [Completed(task_id, {"status": "paid", "by": "alice", "payment": "payment-c-1"})]
    # The journal: the receipt's wait, the approval's, then the payment step.
    assert [(e.kind.value, e.output) for e in journal(runifold_store, task_id)][-1] == ("step", "payment-c-1")


def test_a_claim_nobody_approves_expires_after_the_2_day_timeout_and_its_escalation(
    runifold_store: WorkflowStore, runifold_clock: StoreClock
) -> None:
    task_id = submit(runifold_store, "c-2")
    # Sent before its wait began, the receipt is kept for it.
    send_signal(runifold_store, task_id, "receipt", {"url": "s3://receipts/c-2.pdf"})
    started, store_started = time.monotonic(), runifold_clock.now()

    run_until_idle(runifold_store, registry)  # 2 days for alice or bob, then 1 for carol

    assert result(runifold_store, task_id) == {"status": "expired"}
    assert runifold_clock.now() - store_started >= timedelta(days=3)
    assert time.monotonic() - started < 1.0


def test_carol_decides_once_the_2_days_have_passed(
    runifold_store: WorkflowStore, runifold_clock: StoreClock
) -> None:
    task_id = submit(runifold_store, "c-3")
    send_signal(runifold_store, task_id, "receipt", {"url": "s3://receipts/c-3.pdf"})
    run_until_idle(runifold_store, registry, skip_time=False)

    runifold_clock.advance(timedelta(days=2, seconds=1))  # alice and bob let it lapse
    run_until_idle(runifold_store, registry, skip_time=False)  # escalated to carol
    approve(runifold_store, task_id, "manager-approval", approver="carol", approved=False, reason="no")
    run_until_idle(runifold_store, registry)

    assert result(runifold_store, task_id) == {"status": "rejected", "by": "carol", "reason": "no"}
