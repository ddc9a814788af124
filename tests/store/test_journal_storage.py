"""Journal storage on each store: a commit writes its journal rows with the head in one
fenced write (and none when the fence refuses it), a long workflow's journal replays
exactly, ``show`` pages it, and ``ctx.continue_as_new`` starts a run afresh."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
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
from runifold_sync.errors import CancelPending, LeaseLostError
from runifold_sync.model.checkpoint import MAIN, TAIL_ENTRIES, JournalRow
from runifold_sync.model.codec import from_json
from runifold_sync.outcomes import Completed, ContinuedAsNew, Failed
from runifold_sync.store import TaskState
from runifold_sync.store.checkpoints import newest_entries, read_checkpoint
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("w1")
HEAD = '{"format_version":2}'
RAN: list[str] = []


def _claim(store: WorkflowStore, task_id: str = "t1") -> Any:
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id=task_id))
    (claimed,) = store.claim(W1, LEASE)
    return claimed


def _worker(store: WorkflowStore, *workflows: Workflow) -> WorkflowWorker:
    registry = WorkflowRegistry()
    for workflow in workflows:
        registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(store, registry, W1, LEASE, timedelta(seconds=10))


# --- the store: rows ride the fenced write ----------------------------------------------


def test_a_commit_writes_rewrites_and_deletes_journal_rows_with_its_head(store: WorkflowStore) -> None:
    claimed = _claim(store)
    rows = [
        JournalRow(MAIN, 0, '{"n":0}'),
        JournalRow(MAIN, 1, '{"n":1}'),
        JournalRow("parallel#1/a", 0, '{"a":0}'),
    ]
    first = store.commit_checkpoint(claimed.lease, claimed.revision, HEAD, journal=rows)
    assert store.read_journal("t1") == [rows[0], rows[1], rows[2]]
    changed = [JournalRow(MAIN, 1, '{"n":"one"}'), JournalRow("parallel#1/a", 0, None)]
    store.commit_checkpoint(claimed.lease, first.revision, HEAD, journal=changed)
    assert store.read_journal("t1") == [rows[0], changed[0]]
    assert store.get_task("t1").checkpoint_json == HEAD


def test_a_refused_write_stores_none_of_its_journal_rows(store: WorkflowStore) -> None:
    claimed = _claim(store)
    store.commit_checkpoint(claimed.lease, claimed.revision, HEAD, journal=[JournalRow(MAIN, 0, '{"n":0}')])
    late = [JournalRow(MAIN, 1, '{"stale":true}'), JournalRow(MAIN, 0, None)]
    with pytest.raises(LeaseLostError):  # the revision it extends is gone
        store.commit_checkpoint(claimed.lease, claimed.revision, HEAD, journal=late)
    with pytest.raises(LeaseLostError):
        store.complete(claimed.lease, claimed.revision, HEAD, "null", journal=late)
    store.set_clock_offset(timedelta(minutes=5))  # past the lease
    (taken,) = store.claim(WorkerId.parse("w2"), LEASE)
    with pytest.raises(LeaseLostError):  # an old token
        store.commit_checkpoint(claimed.lease, taken.revision, HEAD, journal=late)
    assert store.read_journal("t1") == [JournalRow(MAIN, 0, '{"n":0}')]


def test_every_write_that_ends_a_claim_carries_its_journal_rows(store: WorkflowStore) -> None:
    row = JournalRow(MAIN, 0, '{"n":0}')
    for task_id, end in (
        (
            "suspended",
            lambda c: store.suspend(c.lease, c.revision, HEAD, wake_at=None, reason="r", journal=[row]),
        ),
        (
            "retried",
            lambda c: store.retry(
                c.lease, c.revision, HEAD, delay=timedelta(hours=1), reason="r", journal=[row]
            ),
        ),
        ("failed", lambda c: store.fail(c.lease, c.revision, HEAD, reason="r", journal=[row])),
        ("completed", lambda c: store.complete(c.lease, c.revision, HEAD, "1", journal=[row])),
    ):
        end(_claim(store, task_id))
        assert store.read_journal(task_id) == [row], task_id


def test_the_journal_tail_is_the_newest_entries_in_order_with_the_count(store: WorkflowStore) -> None:
    claimed = _claim(store)
    rows = [JournalRow(MAIN, n, f'{{"n":{n}}}') for n in range(30)] + [JournalRow("parallel#1/a", 0, "{}")]
    store.commit_checkpoint(claimed.lease, claimed.revision, HEAD, journal=rows)
    assert store.journal_tail("t1", 3) == (30, rows[27:30])
    assert store.journal_tail("missing", 3) == (0, [])


def test_continue_as_new_requeues_with_the_new_input_and_no_journal_unless_a_cancel_waits(
    store: WorkflowStore,
) -> None:
    claimed = _claim(store)
    committed = store.commit_checkpoint(
        claimed.lease, claimed.revision, HEAD, journal=[JournalRow(MAIN, 0, "{}")]
    )
    store.continue_as_new(claimed.lease, committed.revision, '{"format_version":2,"run":2}', "5", run=2)
    record = store.get_task("t1")
    assert (record.state, record.input, record.checkpoint_json) == (
        TaskState.QUEUED,
        5,
        '{"format_version":2,"run":2}',
    )
    assert store.read_journal("t1") == []
    assert [e.detail for e in store.history("t1") if e.kind == "continued"] == [{"run": 2}]

    again = store.claim(W1, LEASE)[0]
    assert store.cancel("t1", "ops", "stop") is TaskState.LEASED
    with pytest.raises(CancelPending):
        store.continue_as_new(again.lease, again.revision, HEAD, "6", run=3)


# --- the worker: long journals and continue_as_new ---------------------------------------

counting = Workflow("counting", 1)


@counting.step()
def count(ctx: StepContext, n: int) -> int:
    RAN.append(ctx.call_id)
    return n + 1


@counting.main
def count_main(ctx: WorkflowContext, steps: int) -> int:
    total = 0
    for _ in range(steps):
        total = count(ctx, total)
        if total == steps // 2:
            ctx.sleep(timedelta(seconds=1))  # a claim in the middle loads half the journal
    return total


def test_a_long_workflow_replays_its_stored_journal_without_running_a_step_again(
    store: WorkflowStore,
) -> None:
    RAN.clear()
    steps = 1500
    store.enqueue(WorkflowTask.new("counting", 1, steps, checkpoint_id="long"))
    worker = _worker(store, counting)
    try:
        assert worker.run_once().kind == "suspended"
        halfway = read_checkpoint(store, "long")
        assert halfway is not None and len(halfway.journal) == steps // 2 + 1  # the steps and the timer
        assert len(store.read_journal("long")) > steps // 2 - TAIL_ENTRIES  # most of them rows
        store.set_clock_offset(timedelta(seconds=5))
        assert worker.run_once() == Completed("long", steps)
    finally:
        worker.close()
    assert len(RAN) == steps == len(set(RAN))
    checkpoint = read_checkpoint(store, "long")
    assert checkpoint is not None and len(checkpoint.journal) == steps + 1
    assert checkpoint.usage.steps == steps
    # show's page: the newest entries, from the rows and the head's tail together.
    total, newest = newest_entries(store, "long", store.get_task("long").checkpoint_json or "", 40)
    assert total == steps + 1
    assert [e["call_id"] for e in newest] == [f"count#{n}" for n in range(steps - 39, steps + 1)]


subscription = Workflow("subscription", 1)


@subscription.step()
def bill(ctx: StepContext, month: int) -> str:
    RAN.append(f"{ctx.call_id}@{month}")
    return f"invoice-{month}"


@subscription.main
def subscription_main(ctx: WorkflowContext, month: int) -> str:
    invoice = bill(ctx, month)
    if month < 3:
        ctx.continue_as_new(month + 1)
    return invoice


def test_continue_as_new_starts_each_run_afresh_keeping_history_and_usage(store: WorkflowStore) -> None:
    RAN.clear()
    store.enqueue(WorkflowTask.new("subscription", 1, 1, checkpoint_id="sub"))
    worker = _worker(store, subscription)
    try:
        outcomes = [worker.run_once() for _ in range(3)]
    finally:
        worker.close()
    assert outcomes == [ContinuedAsNew("sub", 2), ContinuedAsNew("sub", 3), Completed("sub", "invoice-3")]
    assert RAN == ["bill#1@1", "bill#1@2", "bill#1@3"]  # each run's call ids start again
    checkpoint = read_checkpoint(store, "sub")
    assert checkpoint is not None
    assert (checkpoint.run, [e.call_id for e in checkpoint.journal]) == (3, ["bill#1"])
    assert (checkpoint.usage.steps, checkpoint.usage.claims) == (3, 3)  # carried over
    record = store.get_task("sub")
    assert (record.input, record.result) == (3, "invoice-3")
    history = store.history("sub")
    assert [e.detail["run"] for e in history if e.kind == "continued"] == [2, 3]
    assert [e.kind for e in history].count("claimed") == 3


misused = Workflow("misused", 1)


@misused.main
def misused_main(ctx: WorkflowContext, how: str) -> None:
    if how == "input":
        ctx.continue_as_new(object())
    ctx.parallel({"a": lambda c: c.continue_as_new(1)})


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("input", "continue_as_new input is not JSON-serializable"),
        ("branch", "continue_as_new is for the main function, not parallel branch 'parallel#1/a'"),
    ],
)
def test_continue_as_new_with_input_that_cannot_be_stored_or_from_a_branch_fails_naming_it(
    store: WorkflowStore, how: str, message: str
) -> None:
    store.enqueue(WorkflowTask.new("misused", 1, how, checkpoint_id=how))
    worker = _worker(store, misused)
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
    assert isinstance(outcome, Failed) and outcome.error.error_class == "InvalidArgument"
    assert message in outcome.reason
    assert from_json(store.get_task(how).input_json) == how  # the input is the one it had


def test_a_cancel_that_reaches_the_task_before_its_continue_wins_and_the_run_is_undone(
    backend: Backend,
) -> None:
    """The continue transition is refused while a cancel is pending, like a completion:
    the run's completed step is compensated and the task ends cancelled, not continued."""
    store, operator = backend.open(), backend.open()
    undone: list[int] = []
    renewing = Workflow("renewing", 1)

    @renewing.step()
    def charge(ctx: StepContext, month: int) -> int:
        assert operator.cancel(ctx.task_id, "ops", "customer left") is TaskState.LEASED
        return month

    @renewing.compensate_for("charge")
    def refund(ctx: StepContext, month: int) -> None:
        undone.append(month)

    @renewing.main
    def main(ctx: WorkflowContext, month: int) -> int:
        charge(ctx, month)
        ctx.continue_as_new(month + 1)
        return month

    store.enqueue(WorkflowTask.new("renewing", 1, 1, checkpoint_id="r1"))
    worker = _worker(store, renewing)
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
    assert outcome.kind == "cancelled", outcome
    assert undone == [1]
    record = store.get_task("r1")
    assert (record.state, record.input) == (TaskState.CANCELLED, 1)  # the input of run 1, never continued
    assert "continued" not in [e.kind for e in store.history("r1")]
