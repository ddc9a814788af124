"""The workflows and the stored tasks the dashboard tests look at: ``seed(store)`` runs
them in-process (``run_until_idle``) to real checkpoints, journals, events, signals,
children and history, and leaves one task of each kind the pages show."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs

from runifold_sync import (
    Budget,
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
)
from runifold_sync.store import TenantPolicy
from runifold_sync.testing import run_until_idle

# What the escaping tests store in every field a page shows.
XSS = ("<script>alert(1)</script>", '"><img src=x onerror=alert(1)>')


def orders_flow(name: str = "orders", signal: str = "go") -> Workflow:
    """Packs the order, publishes its stage, and waits for signal ``signal``, whose
    payload it returns with the label."""
    flow = Workflow(name, 1, signals=[signal])

    @flow.step()
    def pack(ctx: StepContext, order: Any) -> str:
        return f"packed {order}"

    @flow.main
    def run(ctx: WorkflowContext, order: Any) -> Any:
        ctx.set_event("stage", "packing")
        label = pack(ctx, order)
        return {"label": label, "go": ctx.wait_for_signal(signal)}

    return flow


def broken_flow(name: str = "broken") -> Workflow:
    """Fails at once with its input as the error message."""
    flow = Workflow(name, 1)

    @flow.step(retry=RetryPolicy(max_attempts=1))
    def explode(ctx: StepContext, message: str) -> None:
        raise ValueError(message)

    @flow.main
    def run(ctx: WorkflowContext, message: str) -> None:
        explode(ctx, message)

    return flow


def parent_flow() -> Workflow:
    flow = Workflow("parent", 1)

    @flow.main
    def run(ctx: WorkflowContext, order: Any) -> Any:
        return ctx.run_child("orders", 1, order, checkpoint_id="child-1")

    return flow


# The budget of every definition ``registry`` registers.
BUDGET = Budget(max_steps=40, max_cost=12.5)


def registry(*flows: Workflow) -> WorkflowRegistry:
    found = WorkflowRegistry()
    for flow in flows or (orders_flow(), broken_flow(), parent_flow()):
        found.register(WorkflowDefinition(flow, budget=BUDGET))
    return found


@attrs.frozen
class Seeded:
    """The ids of the seeded tasks, by what they are."""

    waiting: str = "order-1"  # waits for signal "go", a published event and a journal
    completed: str = "order-2"  # signalled, completed with a result
    failed: str = "broken-1"
    parent: str = "parent-1"  # waits for its child "child-1"
    queued: str = "queued-1"  # tenant globex, queue render: no worker serves it
    ambiguous: str = "ambiguous-1"  # failed on the ambiguous effect "charge-1"


def seed(store: WorkflowStore) -> Seeded:
    ids = Seeded()
    store.set_tenant_policy(TenantPolicy("acme", max_leased=4))
    store.enqueue_many(
        [
            WorkflowTask.new("orders", 1, "A-1", checkpoint_id=ids.waiting, tenant="acme"),
            WorkflowTask.new("orders", 1, "A-2", checkpoint_id=ids.completed, tenant="acme"),
            WorkflowTask.new("broken", 1, "no stock", checkpoint_id=ids.failed),
            WorkflowTask.new("parent", 1, "P-1", checkpoint_id=ids.parent),
        ]
    )
    flows = registry()
    run_until_idle(store, flows)
    store.send_signal(ids.completed, "go", {"ok": True}, signal_id="s-1", sender="ops", tenant="acme")
    run_until_idle(store, flows)
    store.enqueue(WorkflowTask.new("payments", 1, None, checkpoint_id=ids.ambiguous))
    fail_ambiguous(store, ids.ambiguous, "charge-1")
    store.enqueue(
        WorkflowTask.new("render", 2, {"page": 1}, checkpoint_id=ids.queued, tenant="globex", queue="render")
    )
    return ids


def fail_ambiguous(store: WorkflowStore, task_id: str, effect_key: str) -> None:
    """Fail ``task_id`` (queued, no checkpoint) on an ambiguous effect, as a worker that
    lost track of an external call does."""
    (claimed,) = store.claim(WorkerId.parse("seeder"), LeaseDuration(timedelta(seconds=30)))
    assert claimed.lease.task_id == task_id
    store.fail(
        claimed.lease,
        claimed.revision,
        None,
        reason=f"effect {effect_key} may have run",
        ambiguous_effect=effect_key,
    )
