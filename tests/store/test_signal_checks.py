"""Signals the task's definition would refuse, refused where they are sent, on every store
(issue 19, finding 5): a misspelt name once a registry has told the store the version's
signals (enqueued through ``WorkflowRegistry.task``, or a worker serving it started), and,
while the task waits for an approval, a sender who is not an approver or a payload that is
no decision. Each refusal is ``SignalNotAccepted`` naming the field, is recorded in the
history, and keeps nothing; what the store cannot judge yet is accepted and says so."""

from __future__ import annotations

import json
import sqlite3
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from runifold_sync import (
    ApprovalDecision,
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)
from runifold_sync.errors import SignalNotAccepted, SignalRefused
from runifold_sync.outcomes import Completed, Suspended
from runifold_sync.store import SignalCheck
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))


def _expense(signals: tuple[str, ...] = ("approval", "receipt")) -> Workflow:
    wf = Workflow("expense", 1, signals=signals)

    @wf.main
    def main(ctx: WorkflowContext, amount: int) -> dict[str, Any]:
        receipt = ctx.wait_for_signal("receipt")
        decision = ctx.request_approval("approval", approvers=["manager", "cfo"])
        assert isinstance(decision, ApprovalDecision)
        return {"amount": amount, "receipt": receipt, "approver": decision.approver}

    return wf


def _registry() -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_expense()))
    return registry


def _worker(store: WorkflowStore) -> WorkflowWorker:
    return WorkflowWorker(store, _registry(), WorkerId.parse("w1"), LEASE, timedelta(seconds=10))


def _send(store: WorkflowStore, name: str, payload: Any = None, *, sid: str, sender: str = "ops") -> Any:
    return store.send_signal("t1", name, payload, signal_id=sid, sender=sender)


def _refusals(store: WorkflowStore) -> list[tuple[str, str]]:
    return [
        (e.detail["signal_id"], e.detail["refused"])
        for e in store.history("t1")
        if e.kind == "signal_refused"
    ]


def test_a_misspelt_name_is_refused_once_the_task_was_enqueued_through_a_registry(
    store: WorkflowStore,
) -> None:
    store.enqueue(_registry().task("expense", 1, 120, checkpoint_id="t1"))

    with pytest.raises(SignalNotAccepted) as refused:
        _send(store, "reciept", {"url": "r.pdf"}, sid="s1")

    why = "signal 'reciept' is not declared by 'expense' version 1 (it declares 'approval', 'receipt')"
    assert str(refused.value) == f"signal 's1' to task 't1' refused: {why}"
    assert refused.value.field == "name" and isinstance(refused.value, SignalRefused)
    assert isinstance(refused.value, ValueError)
    assert store.pending_signals("t1") == []
    assert _refusals(store) == [("s1", why)]
    # a declared name is kept for its wait
    assert _send(store, "receipt", {"url": "r.pdf"}, sid="s2").checked is SignalCheck.DECLARED


def test_without_a_registry_signals_are_accepted_unchecked_until_a_worker_serving_the_version_starts(
    store: WorkflowStore,
) -> None:
    store.enqueue(WorkflowTask.new("expense", 1, 120, checkpoint_id="t1"))
    early = _send(store, "reciept", sid="s1")
    assert (early.created, early.checked) == (True, SignalCheck.UNCHECKED)

    worker = _worker(store)
    try:
        assert isinstance(worker.run_once(), Suspended)  # the wait refuses the early one, as before
        assert [s.signal_id for s in store.pending_signals("t1")] == []
        with pytest.raises(SignalNotAccepted, match="'recipt' is not declared by 'expense' version 1"):
            _send(store, "recipt", sid="s2")  # the worker told the store what the version declares
        store.enqueue(WorkflowTask.new("expense", 1, 5, checkpoint_id="t2"))
        with pytest.raises(SignalNotAccepted, match="not declared"):
            store.send_signal("t2", "approvals", None, signal_id="s3", sender="ops")
    finally:
        worker.close()


def test_an_approval_the_task_waits_for_refuses_non_approvers_and_malformed_decisions(
    store: WorkflowStore,
) -> None:
    store.enqueue(_registry().task("expense", 1, 120, checkpoint_id="t1"))
    worker = _worker(store)
    try:
        assert isinstance(worker.run_once(), Suspended)
        assert _send(store, "receipt", "r.pdf", sid="r1").checked is SignalCheck.WAITING
        assert isinstance(worker.run_once(), Suspended)  # now waiting for the approval

        with pytest.raises(SignalNotAccepted) as intern:
            _send(store, "approval", {"approved": True}, sid="a1", sender="intern")
        assert intern.value.field == "sender"
        assert (
            intern.value.why == "'intern' is not an approver of 'approval' (its approvers now: cfo, manager)"
        )
        with pytest.raises(SignalNotAccepted, match="an approval payload must be") as malformed:
            _send(store, "approval", {"approved": "yes"}, sid="a2", sender="manager")
        assert malformed.value.field == "payload"
        assert store.pending_signals("t1") == []
        assert [sid for sid, _why in _refusals(store)] == ["a1", "a2"]

        assert (
            _send(store, "approval", {"approved": True}, sid="a3", sender="cfo").checked
            is SignalCheck.WAITING
        )
        assert worker.run_once() == Completed("t1", {"amount": 120, "receipt": "r.pdf", "approver": "cfo"})
    finally:
        worker.close()


def test_a_name_any_recorded_fingerprint_of_the_version_declares_is_kept(store: WorkflowStore) -> None:
    """During a deploy that changed a version's signals (a mistake the fingerprint catches),
    a name either side declares is kept for the workers to sort out, never refused."""
    old, new = (
        WorkflowDefinition(_expense(("receipt",))),
        WorkflowDefinition(_expense(("approval", "receipt"))),
    )
    assert old.identity.fingerprint != new.identity.fingerprint
    store.declare_signals([old.declared_signals, new.declared_signals])
    store.enqueue(WorkflowTask.new("expense", 1, 120, checkpoint_id="t1"))

    assert _send(store, "approval", {"approved": True}, sid="s1").checked is SignalCheck.DECLARED
    with pytest.raises(SignalNotAccepted, match=r"\(it declares 'approval', 'receipt'\)"):
        _send(store, "refund", sid="s2")


def test_a_wrong_name_is_refused_as_wrong_before_the_pending_cap_is_counted(backend: Backend) -> None:
    store = open_store(backend.url, max_pending_signals=1)
    backend.opened.append(store)
    store.enqueue(_registry().task("expense", 1, 120, checkpoint_id="t1"))
    _send(store, "receipt", sid="s1")

    with pytest.raises(SignalNotAccepted, match="not declared"):
        _send(store, "reciept", sid="s2")
    with pytest.raises(SignalRefused, match="limit 1"):
        _send(store, "approval", {"approved": True}, sid="s3")


def test_a_redelivery_stores_nothing_and_reports_no_check(store: WorkflowStore) -> None:
    store.enqueue(_registry().task("expense", 1, 120, checkpoint_id="t1"))
    assert _send(store, "receipt", "r.pdf", sid="s1").checked is SignalCheck.DECLARED

    again = _send(store, "receipt", "r.pdf", sid="s1")

    assert (again.created, again.checked) == (False, None)


def _set_waiting_approval(backend: Backend, rule: dict[str, Any]) -> None:
    """Write ``waiting_approval`` as a wait of another release could have left it."""
    text = json.dumps(rule)
    if backend.kind == "sqlite":
        with sqlite3.connect(backend.direct_url.removeprefix("sqlite:///")) as conn:
            conn.execute("UPDATE runifold_tasks SET waiting_approval = ? WHERE task_id = 't1'", (text,))
        return
    with psycopg.connect(backend.direct_url, autocommit=True) as conn:
        conn.execute("UPDATE runifold_tasks SET waiting_approval = %s::jsonb WHERE task_id = 't1'", (text,))


def test_approvers_written_under_an_earlier_lease_are_not_applied_to_the_current_wait(
    backend: Backend,
) -> None:
    """A worker of a release without this column suspends without writing it: the rule an
    earlier wait left must not judge the new wait's signals. The fencing token tells."""
    store = backend.open()
    store.enqueue(_registry().task("expense", 1, 120, checkpoint_id="t1"))
    worker = _worker(store)
    try:
        assert isinstance(worker.run_once(), Suspended)  # waits for "receipt", a plain signal
    finally:
        worker.close()
    token = store.get_task("t1").fencing_token
    stale = {"approvers": ["manager"], "fencing_token": token - 1}
    _set_waiting_approval(backend, stale)
    assert _send(store, "receipt", "r.pdf", sid="s1", sender="intern").checked is SignalCheck.WAITING

    _set_waiting_approval(backend, {**stale, "fencing_token": token})  # as if this wait wrote it
    with pytest.raises(SignalNotAccepted, match="'intern' is not an approver of 'receipt'"):
        _send(store, "receipt", "r2.pdf", sid="s2", sender="intern")
