"""Updates on every backend: ``store.update(task_id, name, payload, timeout=, sender=)``
delivers a signal that the workflow's declared validator (``@workflow.validator``)
accepts or rejects before it is recorded, and returns the workflow's reply
(``ctx.reply``). A rejected update raises :class:`UpdateRejected` with the validator's
message and leaves no trace in the journal; the wait goes on and takes the next one. A
caller whose task never answers gets :class:`WaitTimedOut`, or :class:`UpdateNotAnswered`
once the task has finished. (A worker killed around a reply's or a rejection's commit:
``tests/system/test_attribute_stream_update_crash_points.py``.)"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    SignalTimedOut,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.errors import (
    InvalidArgument,
    SignalRefused,
    UpdateNotAnswered,
    UpdateRejected,
    WaitTimedOut,
)
from runifold_sync.outcomes import Completed, Suspended
from tests.support.backends import Backend, contract_backend
from tests.support.journals import entries
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

WAIT = timedelta(seconds=20)

cart = Workflow("cart", 1, signals=["add", "note"])


@cart.validator("add")
def check_item(item: dict[str, Any]) -> None:
    if item["quantity"] <= 0:
        raise ValueError(f"quantity must be positive, got {item['quantity']}")


@cart.main
def cart_main(ctx: WorkflowContext, size: int) -> list[str]:
    items: list[str] = []
    while len(items) < size:
        update = ctx.wait_for_update("add", timeout=timedelta(hours=1), payload_type=dict[str, Any])
        if isinstance(update, SignalTimedOut):
            break
        items.append(f"{update.payload['quantity']} {update.payload['sku']}")
        ctx.reply(update, {"items": list(items), "by": update.sender})
    if size == 0:  # takes an update and never answers it
        ctx.wait_for_signal("note")
    return items


def run_once(store: WorkflowStore) -> Any:
    return run_cycle(store, WorkflowDefinition(cart), worker_id="w1")


def answered(backend: Backend, task_id: str, payload: Any, name: str = "add") -> Any:
    """What ``store.update`` returns (or the error it raises), called from another
    thread and store, as a caller would, while workers here run the task."""
    caller = backend.open()
    found: list[Any] = []

    def call() -> None:
        try:
            found.append(caller.update(task_id, name, payload, timeout=WAIT, sender="alice"))
        except Exception as exc:
            found.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    store = backend.open()
    for _ in range(40):
        thread.join(0.2)
        if not thread.is_alive():
            break
        run_once(store)
    thread.join(WAIT.total_seconds())
    assert found, "store.update did not return"
    return found[0]


def test_an_update_is_validated_then_recorded_and_answered(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("cart", 1, 2, checkpoint_id="c1"))
    assert isinstance(run_once(store), Suspended)  # waiting for an update
    reply = answered(backend, "c1", {"sku": "tea", "quantity": 2})
    assert reply == {"items": ["2 tea"], "by": "alice"}
    journal = entries(store, "c1")

    rejected = answered(backend, "c1", {"sku": "cake", "quantity": 0})
    assert isinstance(rejected, UpdateRejected)
    assert (
        rejected.reason
        == "rejected by the validator of update 'add': ValueError: quantity must be positive, got 0"
    )
    assert entries(store, "c1") == journal  # no trace of it in the journal
    assert any("quantity must be positive" in str(e.detail) for e in store.history("c1")), [
        (e.kind, e.detail) for e in store.history("c1")
    ]
    misfit = answered(backend, "c1", ["not", "a", "dict"])
    assert isinstance(misfit, UpdateRejected) and "payload does not fit" in misfit.reason
    assert entries(store, "c1") == journal

    assert answered(backend, "c1", {"sku": "jam", "quantity": 1}) == {
        "items": ["2 tea", "1 jam"],
        "by": "alice",
    }
    assert store.get_task("c1").result == ["2 tea", "1 jam"]
    with pytest.raises(SignalRefused):  # finished: refused where it is sent
        store.update("c1", "add", {"sku": "x", "quantity": 1}, timeout=WAIT, sender="alice")


def test_an_update_nobody_answers_times_out_and_then_is_not_answered(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("cart", 1, 0, checkpoint_id="c2"))
    with pytest.raises(WaitTimedOut):  # no worker runs it
        store.update(
            "c2", "add", {"sku": "tea", "quantity": 1}, timeout=timedelta(milliseconds=300), sender="a"
        )
    assert isinstance(run_once(store), Suspended)  # size 0: waits for 'note', never takes 'add'
    caller = backend.open()
    found: list[Exception] = []

    def call() -> None:
        try:
            caller.update(
                "c2", "add", {"sku": "jam", "quantity": 1}, timeout=WAIT, sender="a", update_id="u1"
            )
        except Exception as exc:
            found.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(0.3)  # delivered, and waiting for an answer
    store.send_signal("c2", "note", None, signal_id="n1", sender="a")
    assert run_once(store) == Completed("c2", [])
    thread.join(WAIT.total_seconds())
    assert len(found) == 1 and isinstance(found[0], UpdateNotAnswered), found
    assert "finished without answering update 'add' (u1)" in str(found[0])


def test_validators_are_declared_for_declared_signals() -> None:
    flow = Workflow("v", 1, signals=["a"])
    with pytest.raises(InvalidArgument, match="update 'b' must be a signal"):
        flow.validator("b")
    flow.validator("a")(lambda payload: None)
    with pytest.raises(InvalidArgument, match="already has a validator"):
        flow.validator("a")
