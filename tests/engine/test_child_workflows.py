"""Child workflows on each store: a parent starts children, waits for them durably (its
worker freed), is woken by their end in the same transaction, gets their results or
``ChildFailed``, times out like a signal wait, and cancels its children when cancelled.

Each cycle runs on a new worker, so nothing comes from an earlier worker's memory.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    ChildTimedOut,
    LeaseDuration,
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
from runifold_sync.errors import ChildFailed, InvalidArgument
from runifold_sync.outcomes import Completed, Failed, Suspended
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.records import ClaimedTask
from tests.support.backends import contract_backend
from tests.support.clock import Clock
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
RAN: list[str] = []


@pytest.fixture(autouse=True)
def _fresh_records() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


@attrs.frozen
class Quote:
    sku: str
    cents: int


child = Workflow("quote", 1)


@child.step()
def price(ctx: StepContext, sku: str) -> int:
    RAN.append(f"price {sku}")
    if sku == "broken":
        raise TypeError(f"no price for {sku}")  # a programming error: not retried
    return 100 * len(sku)


@child.main
def child_main(ctx: WorkflowContext, sku: str) -> dict[str, Any]:
    if sku == "slow":
        ctx.sleep(timedelta(days=1))
    return {"sku": sku, "cents": price(ctx, sku)}


parent = Workflow("basket", 1)


@parent.step()
def note(ctx: StepContext, text: str) -> str:
    RAN.append(f"note {text}")
    return text


@parent.main
def parent_main(ctx: WorkflowContext, skus: list[str]) -> Any:
    note(ctx, "before")
    handles = [ctx.start_child("quote", 1, sku) for sku in skus]
    try:
        quotes = ctx.wait_children(handles, timeout=timedelta(hours=1), result_type=Quote)
    except ChildFailed as failed:
        return {"failed": failed.child_id, "outcome": failed.outcome, "reason": failed.reason}
    if isinstance(quotes, ChildTimedOut):
        return {"timed_out": list(quotes.task_ids)}
    assert all(isinstance(q, Quote) for q in quotes)  # structured as result_type
    note(ctx, "after")
    return sum(q.cents for q in quotes)


def _cycle(store: WorkflowStore, worker_id: str = "w") -> Any:
    return run_cycle(store, WorkflowDefinition(parent), WorkflowDefinition(child), worker_id=worker_id)


def _until_idle(store: WorkflowStore) -> list[Any]:
    outcomes = []
    for turn in range(20):
        outcome = _cycle(store, f"w{turn}")
        if outcome.kind == "idle":
            return outcomes
        outcomes.append(outcome)
    raise AssertionError(f"still busy after 20 cycles: {outcomes}")


def _enqueue(store: WorkflowStore, skus: list[str], task_id: str = "b1", tenant: str = "acme") -> None:
    store.enqueue(WorkflowTask.new("basket", 1, skus, checkpoint_id=task_id, tenant=tenant))


def test_a_parent_waits_durably_for_its_children_and_gets_their_results(store: WorkflowStore) -> None:
    _enqueue(store, ["ab", "abc"])
    first = _cycle(store)
    assert isinstance(first, Suspended) and "waiting for child task 'b1:child:quote-1'" in first.reason
    waiting = store.get_task("b1")
    assert (waiting.state, waiting.waiting_for_child) == (TaskState.WAITING, "b1:child:quote-1")
    children = store.list_tasks(parent="b1")
    assert [(c.task_id, c.tenant, c.parent_id) for c in children] == [
        ("b1:child:quote-1", "acme", "b1"),
        ("b1:child:quote-2", "acme", "b1"),
    ]
    outcomes = _until_idle(store)
    assert outcomes[-1] == Completed("b1", 500)
    # Each body ran once: the parent's replays returned the handles without enqueueing again.
    assert RAN == ["note before", "price ab", "price abc", "note after"]
    for c in children:
        assert [e.kind for e in store.history(c.task_id)].count("enqueued") == 1
        assert store.history(c.task_id)[0].detail["parent"] == "b1"


def test_a_child_ending_wakes_its_waiting_parent_in_the_same_transaction(store: WorkflowStore) -> None:
    _enqueue(store, ["ab"])
    assert isinstance(_cycle(store), Suspended)
    timeout_at = store.get_task("b1").ready_at
    assert timeout_at is not None and timeout_at > store.now() + timedelta(minutes=59)  # the wait's timeout
    assert _cycle(store) == Completed("b1:child:quote-1", {"sku": "ab", "cents": 200})
    woken = store.get_task("b1")
    assert woken.state is TaskState.WAITING and woken.ready_at is not None
    assert woken.ready_at <= store.now()
    assert _cycle(store) == Completed("b1", 200)


def test_a_failed_child_raises_child_failed_in_the_parent_which_may_catch_it(store: WorkflowStore) -> None:
    _enqueue(store, ["ab", "broken"])
    outcomes = _until_idle(store)
    assert isinstance(outcomes[2], Failed) and outcomes[2].task_id == "b1:child:quote-2"
    result = store.get_task("b1")
    assert result.outcome is TaskOutcome.COMPLETED
    assert result.result == {
        "failed": "b1:child:quote-2",
        "outcome": "failed",
        "reason": store.get_task("b1:child:quote-2").reason,
    }
    assert "no price for broken" in result.result["reason"]


def test_a_cancelled_child_is_a_child_failed_with_outcome_cancelled(store: WorkflowStore) -> None:
    _enqueue(store, ["ab"])
    _cycle(store)
    assert store.cancel("b1:child:quote-1", "alice", "not needed") is TaskState.CANCELLED
    assert store.get_task("b1").ready_at is not None  # the operator's cancel woke it too
    assert _cycle(store) == Completed(
        "b1",
        {"failed": "b1:child:quote-1", "outcome": "cancelled", "reason": "cancelled by alice: not needed"},
    )


def test_a_child_wait_times_out_like_a_signal_wait(store: WorkflowStore, clock: Clock) -> None:
    _enqueue(store, ["slow"])
    _cycle(store)  # the parent waits for the child
    assert isinstance(_cycle(store), Suspended)  # the child sleeps a day
    assert _cycle(store).kind == "idle"
    clock.advance(timedelta(hours=1, seconds=1))
    assert _cycle(store) == Completed("b1", {"timed_out": ["b1:child:quote-1"]})
    assert store.get_task("b1:child:quote-1").state is TaskState.WAITING  # it keeps running


def test_cancelling_a_parent_cancels_its_unfinished_children_with_the_parent_as_actor(
    store: WorkflowStore,
) -> None:
    _enqueue(store, ["ab", "slow"])
    _cycle(store)  # parent waiting, both children queued
    assert _cycle(store) == Completed("b1:child:quote-1", {"sku": "ab", "cents": 200})
    assert isinstance(_cycle(store), Suspended)  # parent woken, waits for the second
    assert store.cancel("b1", "alice", "order withdrawn") is TaskState.CANCELLED
    done, slow = store.get_task("b1:child:quote-1"), store.get_task("b1:child:quote-2")
    assert done.outcome is TaskOutcome.COMPLETED  # a finished child is left as it is
    assert slow.state is TaskState.CANCELLED
    cancelled = [e for e in store.history(slow.task_id) if e.kind == "cancelled"]
    assert [e.detail["actor"] for e in cancelled] == ["b1"]
    assert "its parent task was cancelled by alice: order withdrawn" in cancelled[0].detail["reason"]


def test_a_child_may_run_in_another_tenant_and_the_handle_names_it(store: WorkflowStore) -> None:
    solo = Workflow("solo", 1)

    @solo.main
    def solo_main(ctx: WorkflowContext, _input: None) -> str:
        handle = ctx.start_child("quote", 1, "ab", checkpoint_id="my-quote", tenant="pricing")
        return handle.task_id

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(solo))
    store.enqueue(WorkflowTask.new("solo", 1, None, checkpoint_id="s1", tenant="acme"))
    worker = WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=5))
    try:
        assert worker.run_once() == Completed("s1", "my-quote")
    finally:
        worker.close()
    started = store.get_task("my-quote")
    assert (started.tenant, started.parent_id, started.state) == ("pricing", "s1", TaskState.QUEUED)


# --- the store's part: the wake and its race with the parent's suspend ---------------------

W1 = WorkerId.parse("worker-1")


def _claim_one(store: WorkflowStore, task_id: str) -> ClaimedTask:
    """The next task in claim order, which the test knows is ``task_id``."""
    (claimed,) = store.claim(W1, LEASE, limit=1)
    assert claimed.lease.task_id == task_id
    return claimed


def _family(store: WorkflowStore, children: int = 1) -> None:
    """Parent ``p`` and its children ``c1``..., claimable in that order."""
    store.enqueue(WorkflowTask.new("basket", 1, None, checkpoint_id="p"))
    for n in range(1, children + 1):
        task = WorkflowTask.new("quote", 1, None, checkpoint_id=f"c{n}")
        store.enqueue(attrs.evolve(task, parent_id="p"))


def _complete(store: WorkflowStore, claimed: ClaimedTask) -> None:
    store.complete(claimed.lease, claimed.revision, "{}", "1")


def test_a_suspend_for_a_child_that_already_ended_is_woken_at_once(store: WorkflowStore) -> None:
    _family(store)
    parent_claim = _claim_one(store, "p")
    _complete(store, _claim_one(store, "c1"))  # ends while the parent still runs
    store.suspend(parent_claim.lease, parent_claim.revision, "{}", wake_at=None, reason="w", child="c1")
    woken = store.get_task("p")
    assert woken.state is TaskState.WAITING and woken.ready_at is not None and woken.ready_at <= store.now()


def test_only_the_child_a_parent_waits_for_wakes_it(store: WorkflowStore) -> None:
    _family(store, children=2)
    parent_claim = _claim_one(store, "p")
    store.suspend(parent_claim.lease, parent_claim.revision, "{}", wake_at=None, reason="w", child="c1")
    c1, c2 = _claim_one(store, "c1"), _claim_one(store, "c2")
    _complete(store, c2)
    assert store.get_task("p").ready_at is None
    _complete(store, c1)
    assert store.get_task("p").ready_at is not None


def test_a_childs_end_racing_its_parents_suspend_always_leaves_the_parent_woken(store: WorkflowStore) -> None:
    """The race the row lock settles: on PostgreSQL the child's end and the parent's
    suspend run concurrently, in either order, and the parent must never be left asleep."""
    for round_ in range(15):
        parent_id, child_id = f"p{round_}", f"c{round_}"
        store.enqueue(WorkflowTask.new("basket", 1, None, checkpoint_id=parent_id))
        task = WorkflowTask.new("quote", 1, None, checkpoint_id=child_id)
        store.enqueue(attrs.evolve(task, parent_id=parent_id))
        claims = {c.lease.task_id: c for c in (_claim_one(store, parent_id), _claim_one(store, child_id))}
        start = threading.Barrier(2)

        def end_child(claimed: ClaimedTask, start: threading.Barrier) -> None:
            start.wait()
            _complete(store, claimed)

        ender = threading.Thread(target=end_child, args=(claims[child_id], start))
        ender.start()
        start.wait()
        p = claims[parent_id]
        store.suspend(p.lease, p.revision, "{}", wake_at=None, reason="w", child=child_id)
        ender.join()
        woken = store.get_task(parent_id)
        assert woken.ready_at is not None, f"round {round_}: the parent was left waiting for an ended child"
        _complete(store, _claim_one(store, parent_id))  # out of the next round's way


def test_two_children_ending_at_the_same_moment_wake_the_parent_once_without_deadlock(
    store: WorkflowStore,
) -> None:
    _family(store, children=2)
    parent_claim = _claim_one(store, "p")
    store.suspend(parent_claim.lease, parent_claim.revision, "{}", wake_at=None, reason="w", child="c1")
    claims = [_claim_one(store, "c1"), _claim_one(store, "c2")]
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def end(claimed: ClaimedTask) -> None:
        start.wait()
        try:
            _complete(store, claimed)
        except BaseException as exc:  # reported below: a thread's error would be lost
            errors.append(exc)

    threads = [threading.Thread(target=end, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [store.get_task(c).outcome for c in ("c1", "c2")] == [TaskOutcome.COMPLETED] * 2
    assert store.get_task("p").ready_at is not None
    assert [c.lease.task_id for c in store.claim(W1, LEASE, limit=5)] == ["p"]


def test_a_child_enqueued_again_with_the_same_id_and_parent_is_the_same_task(store: WorkflowStore) -> None:
    _family(store)
    task = WorkflowTask.new("quote", 1, None, checkpoint_id="c1", not_before=store.now() + timedelta(days=1))
    assert store.enqueue(attrs.evolve(task, parent_id="p")).created is False
    with pytest.raises(Exception, match="different parent"):
        store.enqueue(attrs.evolve(task, parent_id="someone-else"))


def test_a_child_may_go_on_a_named_queue_and_a_bad_queue_name_is_refused(store: WorkflowStore) -> None:
    routed = Workflow("routed", 1)

    @routed.main
    def routed_main(ctx: WorkflowContext, _input: None) -> list[str]:
        refused = []
        for bad in (" gpu", "", "g\npu"):
            try:
                ctx.start_child("quote", 1, "ab", queue=bad)
            except InvalidArgument as exc:
                refused.append(str(exc))
        plain = ctx.start_child("quote", 1, "ab", checkpoint_id="plain-quote")
        gpu = ctx.start_child("quote", 1, "abc", checkpoint_id="gpu-quote", queue="gpu")
        return [*refused, plain.task_id, gpu.task_id]

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(routed))
    store.enqueue(WorkflowTask.new("routed", 1, None, checkpoint_id="r1", queue="parents"))
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=5), queues=("parents",)
    )
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
    assert isinstance(outcome, Completed)
    *refused, plain_id, gpu_id = outcome.result
    assert (plain_id, gpu_id) == ("plain-quote", "gpu-quote")
    assert len(refused) == 3 and all(m.startswith("queue ") for m in refused)
    assert "' gpu'" in refused[0] and "'g\\npu'" in refused[2]
    # The default is the `default` queue, not the parent's; only the named child moved.
    assert store.get_task("plain-quote").queue == "default"
    assert store.get_task("gpu-quote").queue == "gpu"
    assert [t.task_id for t in store.list_tasks(queue="gpu")] == ["gpu-quote"]
    assert store.get_task("gpu-quote").parent_id == "r1"
