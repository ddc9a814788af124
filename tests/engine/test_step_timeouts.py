"""Step and effect timeouts with workers in this process (``run_once`` outside a pool),
on every store: what a worker can do about a body that overruns its timeout without
being able to interrupt it.

- A step whose body ends past its deadline timed out, whatever it returned: the attempt
  counts under its retry policy, and the task fails once they are used up, the reason
  naming the step and the timeout. An effect's late result is kept.
- A body still running past its deadline loses its task: the heartbeat stops extending
  the lease, another worker claims the task once it runs out, counts the attempt and
  runs the next one; the stuck worker's late answer is refused (``LeaseLost``).
- The time the hung attempt ran counts toward ``Budget.max_duration``.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

import pytest

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
    WorkflowWorker,
)
from runifold_sync.outcomes import Completed, Failed, LeaseLost, Retried, RunOutcome
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

SHORT = timedelta(milliseconds=300)
LEASE = LeaseDuration(timedelta(seconds=1))
HEARTBEAT = timedelta(milliseconds=100)
RUNS: list[tuple[str, int]] = []  # (body, attempt) of every body that began
RELEASE = threading.Event()  # lets a hung first attempt end


def _hang_first_attempt(ctx: StepContext) -> None:
    RUNS.append((ctx.call_id, ctx.attempt))
    if ctx.attempt == 1:
        assert RELEASE.wait(30), "the test never released the hung attempt"


late = Workflow("late-step", 1)


@late.step(timeout=SHORT, retry=RetryPolicy(max_attempts=2, initial_backoff=timedelta(milliseconds=10)))
def slow(ctx: StepContext, n: int) -> int:
    RUNS.append((ctx.call_id, ctx.attempt))
    time.sleep(SHORT.total_seconds() * 2)
    return n


@late.main
def late_main(ctx: WorkflowContext, n: int) -> int:
    return slow(ctx, n)


late_effect = Workflow("late-effect", 1)


@late_effect.effect(idempotent=False, timeout=SHORT)
def send(ctx: StepContext, n: int) -> str:
    RUNS.append((ctx.call_id, ctx.attempt))
    time.sleep(SHORT.total_seconds() * 2)
    return f"sent {ctx.idempotency_key}"


@late_effect.main
def late_effect_main(ctx: WorkflowContext, n: int) -> str:
    return send(ctx, n)


hung = Workflow("hung-step", 1)


@hung.step(timeout=SHORT)
def wedged(ctx: StepContext, n: int) -> int:
    _hang_first_attempt(ctx)
    return n + 1


@hung.main
def hung_main(ctx: WorkflowContext, n: int) -> int:
    return wedged(ctx, n)


budgeted = Workflow("hung-budgeted", 1)


@budgeted.step(timeout=SHORT)
def wedged_on_budget(ctx: StepContext, n: int) -> int:
    _hang_first_attempt(ctx)
    return n + 1


@budgeted.main
def budgeted_main(ctx: WorkflowContext, n: int) -> int:
    return wedged_on_budget(ctx, n)


def _registry() -> WorkflowRegistry:
    registry = WorkflowRegistry()
    for flow in (late, late_effect, hung):
        registry.register(WorkflowDefinition(flow))
    registry.register(WorkflowDefinition(budgeted, Budget(max_duration=SHORT * 0.9)))
    return registry


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RUNS.clear()
    RELEASE.clear()


def _worker(store: WorkflowStore, name: str, lease: LeaseDuration = LEASE) -> WorkflowWorker:
    return WorkflowWorker(store, _registry(), WorkerId.parse(name), lease, HEARTBEAT)


def test_a_step_that_ends_past_its_timeout_is_retried_then_fails_naming_the_timeout(
    store: WorkflowStore,
) -> None:
    store.enqueue(WorkflowTask.new("late-step", 1, 7, checkpoint_id="t"))
    clock = Clock(store)
    # The heartbeat stops extending the lease once the body overruns its timeout, so the
    # attempt's end must reach the store within the lease: a long one here, as the case
    # is the late end, not the lost lease (under a 1 s lease a busy machine could delay the
    # commit past it).
    worker = _worker(store, "w1", LeaseDuration(timedelta(seconds=30)))
    try:
        first = worker.run_once()
        assert isinstance(first, Retried), first
        assert first.reason == "step 'slow' timed out after 0.3s (attempt 1 of 2)"
        clock.advance(timedelta(seconds=1))
        last = worker.run_once()
    finally:
        worker.close()
    assert isinstance(last, Failed), last
    assert last.reason == "step 'slow' timed out after 0.3s; gave up after 2 attempts"
    assert last.cause == "step_timeout" and not last.recoverable
    assert last.error is not None and last.error.error_class == "StepTimedOut"
    assert RUNS == [("slow#1", 1), ("slow#1", 2)]
    checkpoint = read_checkpoint(store, "t")
    # Its final failure was recorded for the main function to catch, and taken back out
    # as the task failed of it uncaught (so a retry runs the step again).
    assert checkpoint is not None and checkpoint.journal == [] and checkpoint.deadlines == {}
    failed = [e for e in store.history("t") if e.kind == "failed"]
    assert [e.detail["error_class"] for e in failed] == ["StepTimedOut"]


def test_an_effect_that_ends_past_its_timeout_keeps_its_result(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("late-effect", 1, 1, checkpoint_id="e"))
    worker = _worker(store, "w1")
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
    assert outcome == Completed("e", "sent e/send#1")  # it happened, and now it is known how
    assert RUNS == [("send#1", 1)]


def _run_in_thread(worker: WorkflowWorker) -> tuple[threading.Thread, list[RunOutcome]]:
    """Start ``worker``'s cycle in a thread; returns once its body began."""
    outcomes: list[RunOutcome] = []
    thread = threading.Thread(target=lambda: outcomes.append(worker.run_once()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not RUNS:
        assert time.monotonic() < deadline, f"no body began: {outcomes}"
        time.sleep(0.01)
    return thread, outcomes


def _take_over(worker: WorkflowWorker, within_s: float) -> tuple[RunOutcome, float]:
    """Run cycles of ``worker`` until one claims something; that outcome and when."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        outcome = worker.run_once()
        if outcome.kind != "idle":
            return outcome, time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"no worker took the task over within {within_s} s")


def test_a_step_hung_past_its_timeout_loses_its_lease_to_another_worker(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    store, other_store = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("hung-step", 1, 1, checkpoint_id="h"))
    stuck, other = _worker(store, "stuck"), _worker(other_store, "other")
    caplog.set_level(logging.WARNING)
    try:
        thread, outcomes = _run_in_thread(stuck)
        began = time.monotonic()
        outcome, taken_at = _take_over(other, within_s=10)
        # Not extended past the deadline: claimable at most one lease after it.
        assert taken_at - began < SHORT.total_seconds() + LEASE.seconds + 1.0
        assert outcome == Completed("h", 2)
        assert RUNS == [("wedged#1", 1), ("wedged#1", 2)]  # counted: the second is attempt 2
        RELEASE.set()
        thread.join(10)
        assert len(outcomes) == 1 and isinstance(outcomes[0], LeaseLost), outcomes
    finally:
        RELEASE.set()
        stuck.close()
        other.close()
    assert "wedged#1 is past its timeout of 0.3s: its lease is no longer extended" in caplog.text
    assert "step 'wedged' timed out after 0.3s (attempt 1 of 3); running it again" in caplog.text
    record = store.get_task("h")
    assert (record.state, record.outcome, record.result) == (TaskState.TERMINAL, TaskOutcome.COMPLETED, 2)


def test_the_time_a_hung_step_ran_counts_toward_max_duration(backend: Backend) -> None:
    store, other_store = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("hung-budgeted", 1, 1, checkpoint_id="b"))
    stuck, other = _worker(store, "stuck"), _worker(other_store, "other")
    try:
        thread, _outcomes = _run_in_thread(stuck)
        outcome, _at = _take_over(other, within_s=10)
    finally:
        RELEASE.set()
        thread.join(10)
        stuck.close()
        other.close()
    assert isinstance(outcome, Failed), outcome
    assert outcome.cause == "budget"
    assert outcome.reason.startswith("budget max_duration=0:00:00.270000 exceeded (0.3"), outcome.reason
    assert RUNS == [("wedged_on_budget#1", 1)]  # the second attempt never began
