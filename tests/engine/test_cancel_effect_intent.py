"""A cancel that reaches the row while an effect's intent is being committed stops the
task before the effect's body is called, on SQLite and PostgreSQL.

The intent's commit answers with the pending cancel; before, the worker went straight on
to call the body and only stopped at the boundary after it, so an operator's cancel let
one more outside write happen. The store here is the real one, with its commit wrapped so
that another store (an operator) cancels the task just before the intent's write.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import pytest

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.model.checkpoint import JournalRow
from runifold_sync.model.codec import from_json
from runifold_sync.outcomes import Cancelled
from runifold_sync.store import TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from runifold_sync.store.records import Committed, Lease
from tests.support.backends import Backend

pytestmark = pytest.mark.timeout(120)

NOTE = "cancelled by ops: customer left"


def _booking(log: list[str]) -> Workflow:
    """reserve (undone by release), then a non-idempotent charge, then a receipt."""
    wf = Workflow("booking", 1)

    @wf.step()
    def reserve(ctx: StepContext) -> str:
        log.append("reserve")
        return "r1"

    @wf.compensate_for("reserve")
    def release(ctx: StepContext, reservation: str) -> None:
        log.append(f"release {reservation}")

    @wf.effect(idempotent=False)
    def charge(ctx: StepContext, reservation: str) -> str:
        log.append("charge")
        return f"charged {reservation}"

    @wf.step()
    def receipt(ctx: StepContext, charged: str) -> str:
        log.append("receipt")
        return charged

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return receipt(ctx, charge(ctx, reserve(ctx)))

    return wf


def _holds_an_intent(head_json: str, journal: Sequence[JournalRow]) -> bool:
    """Whether a commit writes an effect's intent: in the head's tail or as a row."""
    written = [e for tail in from_json(head_json)["journal_tail"].values() for e in tail["entries"]]
    written += [from_json(row.entry_json) for row in journal if row.entry_json is not None]
    return any(entry["status"] == "intent" for entry in written)


def test_a_cancel_answered_by_the_effects_intent_commit_stops_it_before_the_call(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, operator = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("booking", 1, None, checkpoint_id="b1"))
    log: list[str] = []
    commit = store.commit_checkpoint

    def cancel_then_commit(
        lease: Lease, revision: int, checkpoint_json: str, *, journal: Sequence[JournalRow] = ()
    ) -> Committed:
        if _holds_an_intent(checkpoint_json, journal):  # the charge's intent, about to be written
            assert operator.cancel("b1", "ops", "customer left") is TaskState.LEASED
        return commit(lease, revision, checkpoint_json, journal=journal)

    monkeypatch.setattr(store, "commit_checkpoint", cancel_then_commit)
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_booking(log)))
    lease = LeaseDuration(timedelta(minutes=20))
    worker = WorkflowWorker(store, registry, WorkerId.parse("w1"), lease, timedelta(minutes=10))
    try:
        outcome = worker.run_once()
    finally:
        worker.close()

    assert outcome == Cancelled("b1", NOTE)
    assert log == ["reserve", "release r1"]  # the charge was never called
    record = operator.get_task("b1")
    assert (record.state, record.reason) == (TaskState.CANCELLED, NOTE)
    checkpoint = read_checkpoint(operator, "b1")
    assert checkpoint is not None
    # The intent was taken back: the end state records no call of the charge at all.
    assert [(e.call_id, e.status) for e in checkpoint.journal] == [("reserve#1", "done")]
    assert (checkpoint.phase, checkpoint.compensated) == ("cancelled", ["reserve#1"])
