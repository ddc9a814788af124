"""Search attributes on every backend: ``ctx.set_attributes`` in a workflow run by a
worker stores typed values (text, integer, number, boolean, time) on its task, in the
fenced commit that carries the progress made so far; ``store.task_attributes`` reads
them back as the kinds they were set as; ``list_tasks(attributes=...)`` and
``list_tasks_page`` find the tasks having every given one, of the same kind and value.

A replayed call writes nothing, so a value set later in the run is never put back to
an earlier one. Bad values are refused at the call, naming the key. (A worker killed
around the attributes' commit is in ``tests/system/test_attribute_stream_update_crash_points.py``.)
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.outcomes import Completed, Failed, Suspended
from runifold_sync.store import TaskState
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
DUE = datetime(2026, 12, 24, 9, 30, tzinfo=timezone(timedelta(hours=2)))

orders = Workflow("orders", 1)


@orders.step()
def price(ctx: StepContext, order: dict[str, Any]) -> int:
    return int(order["amount"])


@orders.main
def orders_main(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    ctx.set_attributes(customer=order["customer"], stage="received")
    amount = price(ctx, order)
    ctx.set_attributes(amount=amount, rate=0.25, vip=order.get("vip", False), due=DUE)
    ctx.sleep(timedelta(minutes=5))
    ctx.set_attributes(stage="shipped")
    return "ok"


def registry(*workflows: Workflow) -> WorkflowRegistry:
    reg = WorkflowRegistry()
    for workflow in workflows or (orders,):
        reg.register(WorkflowDefinition(workflow))
    return reg


def run_once(store: WorkflowStore, reg: WorkflowRegistry | None = None) -> Any:
    worker = WorkflowWorker(store, reg or registry(), WorkerId.parse("w1"), LEASE, timedelta(seconds=5))
    try:
        return worker.run_once()
    finally:
        worker.close()


def enqueue(store: WorkflowStore, task_id: str, customer: str, amount: int, vip: bool = False) -> None:
    order = {"customer": customer, "amount": amount, "vip": vip}
    store.enqueue(WorkflowTask.new("orders", 1, order, checkpoint_id=task_id))


def test_set_attributes_stores_each_kind_and_reads_it_back_as_that_kind(backend: Backend) -> None:
    store = backend.open()
    enqueue(store, "o1", "c-42", 120, vip=True)
    assert isinstance(run_once(store), Suspended)
    found = store.task_attributes("o1")
    assert found == {
        "customer": "c-42",
        "stage": "received",
        "amount": 120,
        "rate": 0.25,
        "vip": True,
        "due": DUE,
    }
    assert type(found["amount"]) is int and type(found["rate"]) is float and type(found["vip"]) is bool
    assert found["due"].utcoffset() == timedelta(0)  # kept in UTC, the same moment
    assert store.task_attributes("nobody") == {}


def test_list_tasks_filters_by_every_given_attribute_of_the_same_kind(backend: Backend) -> None:
    store = backend.open()
    enqueue(store, "o1", "c-42", 120)
    enqueue(store, "o2", "c-42", 80, vip=True)
    enqueue(store, "o3", "c-7", 120)
    for _ in range(3):
        assert isinstance(run_once(store), Suspended)

    def ids(**attributes: Any) -> list[str]:
        return [r.task_id for r in store.list_tasks(attributes=attributes)]

    assert ids(customer="c-42") == ["o1", "o2"]
    assert ids(customer="c-42", amount=120) == ["o1"]
    assert ids(amount=120) == ["o1", "o3"]
    assert ids(vip=True) == ["o2"]
    assert ids(due=DUE.astimezone(UTC)) == ["o1", "o2", "o3"]  # the same moment in another zone
    assert ids(amount=120.0) == []  # a number is not an integer attribute
    assert ids(amount="120") == []  # nor is text
    assert ids(customer="c-99") == []
    # With the other filters, and on the dashboard's pages.
    assert [r.task_id for r in store.list_tasks(state=TaskState.WAITING, attributes={"amount": 120})] == [
        "o1",
        "o3",
    ]
    page = store.list_tasks_page(attributes={"customer": "c-42"}, limit=1)
    assert [r.task_id for r in page.tasks] == ["o1"]
    assert page.next_after is not None
    rest = store.list_tasks_page(attributes={"customer": "c-42"}, after=page.next_after)
    assert [r.task_id for r in rest.tasks] == ["o2"]
    assert [r.task_id for r in store.list_tasks_page(attributes={}).tasks] == ["o1", "o2", "o3"]


def test_a_replay_writes_nothing_and_a_later_value_wins(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    enqueue(store, "o1", "c-42", 120)
    assert isinstance(run_once(store), Suspended)
    assert store.task_attributes("o1")["stage"] == "received"
    clock.advance(timedelta(minutes=6))
    assert isinstance(run_once(store), Completed)  # replays the first set_attributes, sets stage again
    assert store.task_attributes("o1")["stage"] == "shipped"
    assert [r.task_id for r in store.list_tasks(attributes={"stage": "received"})] == []
    assert [r.task_id for r in store.list_tasks(attributes={"stage": "shipped"})] == ["o1"]


bad = Workflow("bad-attributes", 1)


@bad.main
def bad_main(ctx: WorkflowContext, value: Any) -> str:
    if value == "NUL":  # an input cannot hold a NUL character: made here
        value = "a\x00b"
    try:
        ctx.set_attributes(weight=value)
    except InvalidArgument as exc:
        return str(exc)
    return "accepted"


NO_KIND = "attribute 'weight' must be text, an integer, a number, a boolean or an aware datetime"


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (None, f"{NO_KIND}, got None"),
        ([1, 2], f"{NO_KIND}, got [1, 2]"),
        (2**70, f"attribute 'weight' must be a 64-bit integer, got {2**70}"),
        ("x" * 1001, "attribute 'weight' must be at most 1000 characters, got 'xxx"),
        ("NUL", "attribute 'weight' must not contain a NUL character, got 'a\\x00b'"),
    ],
)
def test_a_value_of_no_attribute_kind_is_refused_at_the_call(backend: Backend, value: Any, says: str) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("bad-attributes", 1, value, checkpoint_id="b1"))
    outcome = run_once(store, registry(bad))
    assert isinstance(outcome, Completed), outcome
    assert says in store.get_task("b1").result
    assert store.task_attributes("b1") == {}


def test_bad_filters_are_refused_naming_the_key(backend: Backend) -> None:
    store = backend.open()
    with pytest.raises(InvalidArgument, match="attribute 'at' must be a timezone-aware datetime"):
        store.list_tasks(attributes={"at": datetime(2026, 1, 1)})
    with pytest.raises(InvalidArgument, match="attribute 'x' must be a finite number"):
        store.list_tasks(attributes={"x": float("nan")})
    with pytest.raises(InvalidArgument, match="attributes filter must be a mapping"):
        store.list_tasks(attributes=["customer"])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="attribute key must be non-empty"):
        store.list_tasks(attributes={" customer": "c-42"})


def test_attributes_of_a_failed_claim_are_not_lost(backend: Backend) -> None:
    """An attribute set before a step that fails stays: it was committed at the call."""
    failing = Workflow("failing", 1)

    @failing.step(retry=RetryPolicy(max_attempts=1))
    def boom(ctx: StepContext) -> None:
        raise RuntimeError("boom")

    @failing.main
    def failing_main(ctx: WorkflowContext, _: None) -> None:
        ctx.set_attributes(customer="c-1")
        boom(ctx)

    store = backend.open()
    store.enqueue(WorkflowTask.new("failing", 1, None, checkpoint_id="f1"))
    assert isinstance(run_once(store, registry(failing)), Failed)
    assert [r.task_id for r in store.list_tasks(attributes={"customer": "c-1"})] == ["f1"]
