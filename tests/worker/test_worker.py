"""In-process ``WorkflowWorker`` runs against a real SQLite file.

Store time is moved with ``set_clock_offset`` instead of sleeping. Step bodies record
their calls in the module-level ``CALLS`` list so tests can tell replay from execution.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    Budget,
    EffectEvidence,
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import (
    AmbiguousEffect,
    EnqueueConflict,
    InvalidArgument,
    InvalidState,
    LeaseLostError,
    NonDeterminism,
)
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import (
    Completed,
    DefinitionUnavailable,
    Failed,
    Idle,
    LeaseLost,
    Retried,
    Suspended,
    Yielded,
)
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support.backends import sqlite_clock
from tests.support.clock import Clock
from tests.support.routing import checkpointed_by_other_steps
from tests.support.workers import WorkerFactory

# The in-process worker tests move the clock of ``sqlite_store``.
clock = sqlite_clock

CALLS: list[str] = []
KEYS: list[str | None] = []
REVISIONS: list[int] = []
STATE: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset_module_state() -> Iterator[None]:
    CALLS.clear()
    KEYS.clear()
    REVISIONS.clear()
    STATE.clear()
    yield
    STATE.clear()


def enqueue(store: SqliteWorkflowStore, wf: Workflow, value: Any = None, **kwargs: Any) -> str:
    return store.enqueue(WorkflowTask.new(wf.name, wf.version, value, **kwargs)).task_id


def checkpoint_of(store: SqliteWorkflowStore, task_id: str) -> Checkpoint:
    checkpoint = read_checkpoint(store, task_id)
    assert checkpoint is not None
    return checkpoint


def journal_of(store: SqliteWorkflowStore, task_id: str) -> list[tuple[str, str]]:
    return [(e.call_id, e.status) for e in checkpoint_of(store, task_id).journal]


# Store times are epoch floats turned into datetimes; allow for microsecond rounding.
SLACK = timedelta(milliseconds=1)


def within(value: datetime, low: datetime, high: datetime) -> bool:
    return low - SLACK <= value <= high + SLACK


class SimulatedCrash(BaseException):
    """Escapes every ``except Exception``: the worker process 'dies' mid-call."""


# --- workflows --------------------------------------------------------------------------------


@attrs.frozen
class Reservation:
    order_id: str
    sku: str


@attrs.frozen
class Order:
    order_id: str


three_steps = Workflow("three-steps", 1)


def _note(ctx: StepContext, name: str) -> None:
    CALLS.append(name)
    if "store" in STATE:  # the revision this step runs on top of
        REVISIONS.append(STATE["store"].get_task(ctx.task_id).revision)


@three_steps.step()
def step_a(ctx: StepContext, value: int) -> int:
    _note(ctx, "a")
    return value + 1


@three_steps.step()
def step_b(ctx: StepContext, value: int) -> int:
    _note(ctx, "b")
    return value * 10


@three_steps.step()
def step_c(ctx: StepContext, value: int) -> int:
    _note(ctx, "c")
    return value - 3


@three_steps.main
def three_steps_main(ctx: WorkflowContext, start: int) -> int:
    return step_c(ctx, step_b(ctx, step_a(ctx, start)))


with_sleep = Workflow("with-sleep", 1)


@with_sleep.step()
def reserve(ctx: StepContext, order_id: str) -> Reservation:
    CALLS.append("reserve")
    return Reservation(order_id, "sku-1")


@with_sleep.step()
def describe(ctx: StepContext, reservation: Reservation) -> str:
    CALLS.append("describe")
    return f"{reservation.order_id}:{reservation.sku}"


@with_sleep.main
def with_sleep_main(ctx: WorkflowContext, order: Order) -> str:
    reservation = reserve(ctx, order.order_id)
    CALLS.append(f"main saw {type(reservation).__name__}")
    ctx.sleep(timedelta(seconds=60))
    return describe(ctx, reservation)


flaky = Workflow("flaky", 1)


@flaky.step(retry=RetryPolicy(max_attempts=3, initial_backoff=timedelta(seconds=10), jitter=0.0))
def sometimes_fails(ctx: StepContext) -> str:
    CALLS.append(f"attempt {ctx.attempt}")
    if ctx.attempt < STATE.get("succeed_on_attempt", 99):
        raise ConnectionError("upstream timed out")
    return "ok"


@flaky.main
def flaky_main(ctx: WorkflowContext, _input: None) -> str:
    return sometimes_fails(ctx)


branching = Workflow("branching", 1)


@branching.step()
def left(ctx: StepContext) -> str:
    CALLS.append("left")
    return "left"


@branching.step()
def right(ctx: StepContext) -> str:
    CALLS.append("right")
    return "right"


@branching.main
def branching_main(ctx: WorkflowContext, _input: None) -> str:
    first = right(ctx) if STATE.get("go_right") else left(ctx)
    ctx.sleep(timedelta(seconds=10))
    return first


def _charging_workflow() -> Workflow:
    wf = Workflow("charging", 1)

    @wf.step()
    def expensive(ctx: StepContext) -> None:
        CALLS.append("expensive")
        ctx.charge(2)
        ctx.charge(0.5)

    @wf.step()
    def cheap(ctx: StepContext) -> None:
        CALLS.append("cheap")
        ctx.charge(1)

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        expensive(ctx)
        cheap(ctx)

    return wf


def _effect_workflow(
    *,
    idempotent: bool,
    reconcile: Callable[..., EffectEvidence] | None = None,
    retry: RetryPolicy | None = None,
    sleep_after: bool = False,
) -> Workflow:
    """``charge`` fails according to ``STATE['charge_failure']`` on its first call:
    an exception (retried by policy) or a SimulatedCrash (the worker dies)."""
    wf = Workflow("effects", 1)

    @wf.effect(idempotent=idempotent, reconcile=reconcile, retry=retry)
    def charge(ctx: StepContext, order_id: str) -> dict[str, str]:
        CALLS.append("charge")
        KEYS.append(ctx.idempotency_key)
        failure = STATE.pop("charge_failure", None)
        if failure is not None:
            raise failure
        return {"charge_id": f"ch_{order_id}_{len(CALLS)}"}

    @wf.main
    def main(ctx: WorkflowContext, order: Order) -> dict[str, str]:
        result = charge(ctx, order.order_id)
        if sleep_after:
            ctx.sleep(timedelta(seconds=5))
        return result

    return wf


# --- basic runs -------------------------------------------------------------------------------


def test_empty_store_is_idle(make_worker: WorkerFactory) -> None:
    assert make_worker(WorkflowDefinition(three_steps)).run_once() == Idle()


def test_multi_step_workflow_completes_with_one_revision_per_completed_step(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    STATE["store"] = sqlite_store
    task_id = enqueue(sqlite_store, three_steps, 4)
    outcome = make_worker(WorkflowDefinition(three_steps)).run_once()

    assert outcome == Completed(task_id, 47)
    assert CALLS == ["a", "b", "c"]
    assert REVISIONS == [0, 1, 2]  # each step sees the previous step's commit
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.outcome, record.result) == (TaskState.TERMINAL, TaskOutcome.COMPLETED, 47)
    # The first two steps' results are committed before the next step runs; the last
    # one's goes with the completion.
    assert record.revision == 3
    checkpoint = checkpoint_of(sqlite_store, task_id)
    assert [(e.call_id, e.kind, e.status, e.output) for e in checkpoint.journal] == [
        ("step_a#1", "step", "done", 5),
        ("step_b#1", "step", "done", 50),
        ("step_c#1", "step", "done", 47),
    ]
    assert checkpoint.usage.steps == 3
    assert checkpoint.phase == "completed"


def test_replay_after_suspension_does_not_rerun_recorded_steps(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    worker = make_worker(WorkflowDefinition(with_sleep))
    task_id = enqueue(sqlite_store, with_sleep, {"order_id": "o1"})
    assert isinstance(worker.run_once(), Suspended)
    assert [c for c in CALLS if not c.startswith("main")] == ["reserve"]

    clock.advance(61)
    assert worker.run_once() == Completed(task_id, "o1:sku-1")
    assert [c for c in CALLS if not c.startswith("main")] == ["reserve", "describe"]


def test_step_output_is_structured_back_to_its_attrs_type_on_replay(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    worker = make_worker(WorkflowDefinition(with_sleep))
    enqueue(sqlite_store, with_sleep, {"order_id": "o1"})
    worker.run_once()
    clock.advance(61)
    worker.run_once()
    # the first run returned the live object, the second the replayed one
    assert [c for c in CALLS if c.startswith("main")] == ["main saw Reservation", "main saw Reservation"]


# --- retries --------------------------------------------------------------------------------


def test_failing_step_is_retried_with_backoff_in_store_time(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    STATE["succeed_on_attempt"] = 2
    worker = make_worker(WorkflowDefinition(flaky))
    task_id = enqueue(sqlite_store, flaky)

    before = sqlite_store.now()
    outcome = worker.run_once()
    assert isinstance(outcome, Retried)
    assert "sometimes_fails" in outcome.reason and "ConnectionError" in outcome.reason
    assert within(
        outcome.retry_at, before + timedelta(seconds=10), sqlite_store.now() + timedelta(seconds=10)
    )
    record = sqlite_store.get_task(task_id)
    assert record.state == TaskState.QUEUED
    assert record.ready_at == outcome.retry_at
    assert record.reason == outcome.reason

    assert worker.run_once() == Idle()
    clock.advance(9)
    assert worker.run_once() == Idle()
    clock.advance(2)
    assert worker.run_once() == Completed(task_id, "ok")
    assert CALLS == ["attempt 1", "attempt 2"]
    assert checkpoint_of(sqlite_store, task_id).step_failures == {}


def test_step_failing_every_attempt_fails_the_task_naming_the_step(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    worker = make_worker(WorkflowDefinition(flaky))
    task_id = enqueue(sqlite_store, flaky)

    first = worker.run_once()
    assert isinstance(first, Retried)
    clock.advance(11)
    second = worker.run_once()
    assert isinstance(second, Retried)
    # exponential: the second backoff is twice the first
    delay = (second.retry_at - sqlite_store.now()).total_seconds()
    assert 19 < delay <= 20 + SLACK.total_seconds()
    clock.advance(21)
    outcome = worker.run_once()

    assert isinstance(outcome, Failed)
    assert not outcome.recoverable
    assert "step 'sometimes_fails'" in outcome.reason
    assert "gave up after 3 attempts" in outcome.reason
    assert CALLS == ["attempt 1", "attempt 2", "attempt 3"]
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.outcome, record.reason) == (
        TaskState.TERMINAL,
        TaskOutcome.FAILED,
        outcome.reason,
    )


# --- failing closed -------------------------------------------------------------------------


def test_replay_asking_for_a_different_step_fails_closed_with_non_determinism(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    worker = make_worker(WorkflowDefinition(branching))
    task_id = enqueue(sqlite_store, branching)
    assert isinstance(worker.run_once(), Suspended)

    STATE["go_right"] = True  # the main function no longer does what it recorded
    clock.advance(11)
    outcome = worker.run_once()

    assert isinstance(outcome, Failed)
    assert outcome.reason == str(NonDeterminism(task_id, 0, "left#1", "right#1"))
    assert CALLS == ["left"]  # the diverging step never ran
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.FAILED)
    assert journal_of(sqlite_store, task_id) == [("left#1", "done"), ("timer#1", "pending")]


def test_a_worker_with_a_different_step_graph_hands_the_task_back_without_running_it(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    task_id = enqueue(sqlite_store, with_sleep, {"order_id": "o1"})
    assert isinstance(make_worker(WorkflowDefinition(with_sleep)).run_once(), Suspended)

    changed = Workflow("with-sleep", 1)

    @changed.step()
    def reserve(ctx: StepContext, order_id: str) -> Reservation:
        CALLS.append("changed reserve")
        return Reservation(order_id, "other")

    @changed.main
    def main(ctx: WorkflowContext, order: Order) -> str:
        CALLS.append("changed main")
        return reserve(ctx, order.order_id).sku

    assert changed.fingerprint() != with_sleep.fingerprint()
    clock.advance(61)
    # The claim routes it to the steps its checkpoint was written by: w2 never takes it.
    assert isinstance(make_worker(WorkflowDefinition(changed), worker_id="w2").run_once(), Idle)
    assert not any(c.startswith("changed") for c in CALLS)
    record = sqlite_store.get_task(task_id)
    assert record.state is TaskState.WAITING and record.fingerprint == with_sleep.fingerprint()
    assert record.status_note == (
        f"no live worker serves 'with-sleep' version 1 with step fingerprint {with_sleep.fingerprint()} "
        "(the steps its checkpoint was written by) in queue 'default'"
    )
    # A task claimed before its fingerprint was known (a claim without routes) still
    # reaches w2: the hand-back is the safety net, and the task waits, never fails.
    checkpointed_by_other_steps(sqlite_store, "with-sleep", 1, "stale", fingerprint=with_sleep.fingerprint())
    outcome = make_worker(WorkflowDefinition(changed), worker_id="w3").run_once()
    assert isinstance(outcome, DefinitionUnavailable)
    assert not any(c.startswith("changed") for c in CALLS)
    record = sqlite_store.get_task("stale")
    assert record.state is TaskState.QUEUED and record.outcome is None
    assert record.reason == (
        "definition unavailable: 'with-sleep' version 1 with the steps its checkpoint was written by "
        f"(fingerprint {with_sleep.fingerprint()}) is not on worker w3, whose steps have fingerprint "
        f"{changed.fingerprint()}"
    )


def _crash_claims(store: SqliteWorkflowStore, clock: Clock, times: int) -> None:
    """Claims that die without progress: the lease simply expires each time."""
    for _ in range(times):
        assert len(store.claim(WorkerId.parse("crasher"), LeaseDuration(timedelta(seconds=1)))) == 1
        clock.advance(2)


def test_task_claimed_more_often_than_max_attempts_without_progress_is_failed_as_poison(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    task_id = enqueue(sqlite_store, three_steps, 1)
    _crash_claims(sqlite_store, clock, 2)
    outcome = make_worker(WorkflowDefinition(three_steps, Budget(max_attempts=2))).run_once()

    assert isinstance(outcome, Failed)
    assert "claimed 3 times without progress" in outcome.reason
    assert "max_attempts=2" in outcome.reason
    assert CALLS == []
    assert sqlite_store.get_task(task_id).outcome == TaskOutcome.FAILED


def test_task_claimed_exactly_max_attempts_times_still_runs(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    task_id = enqueue(sqlite_store, three_steps, 1)
    _crash_claims(sqlite_store, clock, 1)
    outcome = make_worker(WorkflowDefinition(three_steps, Budget(max_attempts=2))).run_once()
    assert outcome == Completed(task_id, 17)


def test_budget_max_steps_stops_the_step_over_the_limit(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    task_id = enqueue(sqlite_store, three_steps, 1)
    outcome = make_worker(WorkflowDefinition(three_steps, Budget(max_steps=2))).run_once()

    assert isinstance(outcome, Failed)
    assert "max_steps=2" in outcome.reason
    assert CALLS == ["a", "b"]
    assert journal_of(sqlite_store, task_id) == [("step_a#1", "done"), ("step_b#1", "done")]


def test_charges_from_step_context_accumulate_into_usage_cost(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = _charging_workflow()
    task_id = enqueue(sqlite_store, wf)
    assert isinstance(make_worker(WorkflowDefinition(wf)).run_once(), Completed)
    assert checkpoint_of(sqlite_store, task_id).usage.cost == 3.5


def test_budget_max_cost_fails_the_task_once_charges_exceed_it(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = _charging_workflow()
    enqueue(sqlite_store, wf)
    outcome = make_worker(WorkflowDefinition(wf, Budget(max_cost=2.0))).run_once()
    assert isinstance(outcome, Failed)
    assert "max_cost=2.0" in outcome.reason
    assert CALLS == ["expensive"]


@pytest.mark.parametrize("cost", [-1, float("nan"), True, "2"])
def test_step_context_charge_refuses_a_bad_cost(cost: Any) -> None:
    context = StepContext("t1", "s#1", 1, 1, None)
    with pytest.raises(InvalidArgument, match="charge"):
        context.charge(cost)
    assert context.cost == 0.0


# --- effects ----------------------------------------------------------------------------------


def test_effect_result_is_replayed_on_resume(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(idempotent=False, sleep_after=True)
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, {"order_id": "o1"})
    assert isinstance(worker.run_once(), Suspended)
    clock.advance(6)

    assert worker.run_once() == Completed(task_id, {"charge_id": "ch_o1_1"})
    assert CALLS == ["charge"]
    entry = checkpoint_of(sqlite_store, task_id).journal[0]
    assert (entry.call_id, entry.status, entry.evidence, entry.key) == (
        "charge#1",
        "done",
        "ran",
        f"{task_id}/charge#1",
    )


def test_interrupted_idempotent_effect_is_rerun_with_the_same_key(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(
        idempotent=True, retry=RetryPolicy(max_attempts=2, initial_backoff=timedelta(seconds=1), jitter=0.0)
    )
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, {"order_id": "o1"})
    STATE["charge_failure"] = TimeoutError("gateway timed out")

    assert isinstance(worker.run_once(), Retried)
    assert journal_of(sqlite_store, task_id) == [("charge#1", "intent")]
    clock.advance(2)
    assert worker.run_once() == Completed(task_id, {"charge_id": "ch_o1_2"})

    assert CALLS == ["charge", "charge"]
    assert KEYS == [f"{task_id}/charge#1", f"{task_id}/charge#1"]


def test_crashed_non_idempotent_effect_reconciled_as_applied_is_not_rerun(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    def reconcile(ctx: StepContext, order_id: str) -> EffectEvidence:
        CALLS.append("reconcile")
        KEYS.append(ctx.idempotency_key)
        return EffectEvidence.applied({"charge_id": f"found_{order_id}"})

    wf = _effect_workflow(idempotent=False, reconcile=reconcile)
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, {"order_id": "o1"})
    STATE["charge_failure"] = SimulatedCrash()

    with pytest.raises(SimulatedCrash):
        worker.run_once()
    assert journal_of(sqlite_store, task_id) == [("charge#1", "intent")]
    assert sqlite_store.get_task(task_id).state == TaskState.LEASED
    clock.advance(31)  # the dead worker's lease expires

    assert worker.run_once() == Completed(task_id, {"charge_id": "found_o1"})
    assert CALLS == ["charge", "reconcile"]
    assert KEYS == [f"{task_id}/charge#1", f"{task_id}/charge#1"]
    assert checkpoint_of(sqlite_store, task_id).journal[0].evidence == "reconciled"


def test_crashed_non_idempotent_effect_reconciled_as_not_applied_is_rerun(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(idempotent=False, reconcile=lambda ctx, order_id: EffectEvidence.not_applied())
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, {"order_id": "o1"})
    STATE["charge_failure"] = SimulatedCrash()
    with pytest.raises(SimulatedCrash):
        worker.run_once()
    clock.advance(31)

    assert worker.run_once() == Completed(task_id, {"charge_id": "ch_o1_2"})
    assert CALLS == ["charge", "charge"]


def _fail_on_ambiguous_effect(
    store: SqliteWorkflowStore,
    worker: WorkflowWorker,
    clock: Clock,
    wf: Workflow,
) -> tuple[str, str, Failed]:
    task_id = enqueue(store, wf, {"order_id": "o1"})
    STATE["charge_failure"] = SimulatedCrash()
    with pytest.raises(SimulatedCrash):
        worker.run_once()
    clock.advance(31)
    outcome = worker.run_once()
    assert isinstance(outcome, Failed)
    return task_id, f"{task_id}/charge#1", outcome


def _unknown(ctx: StepContext, order_id: str) -> EffectEvidence:
    CALLS.append("reconcile")
    return EffectEvidence.unknown()


@pytest.mark.parametrize("reconcile", [_unknown, None], ids=["unknown", "no-reconciler"])
def test_effect_with_unknown_outcome_fails_closed_as_recoverable(
    sqlite_store: SqliteWorkflowStore,
    make_worker: WorkerFactory,
    clock: Clock,
    reconcile: Callable[..., EffectEvidence] | None,
) -> None:
    wf = _effect_workflow(idempotent=False, reconcile=reconcile)
    worker = make_worker(WorkflowDefinition(wf))
    task_id, key, outcome = _fail_on_ambiguous_effect(sqlite_store, worker, clock, wf)

    assert outcome.recoverable
    assert outcome.reason == str(AmbiguousEffect(task_id, "charge", key))
    assert CALLS.count("charge") == 1  # never guessed by running it again
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.outcome, record.ambiguous_effect) == (
        TaskState.TERMINAL,
        TaskOutcome.FAILED,
        key,
    )


def test_resolving_an_ambiguous_effect_as_applied_completes_with_the_given_result(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(idempotent=False, reconcile=_unknown)
    worker = make_worker(WorkflowDefinition(wf))
    task_id, key, _ = _fail_on_ambiguous_effect(sqlite_store, worker, clock, wf)

    sqlite_store.resolve_effect(
        task_id, key, applied=True, result_json='{"charge_id": "ch_ops"}', actor="ops", reason="checked"
    )
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.outcome, record.ambiguous_effect) == (TaskState.QUEUED, None, None)

    assert worker.run_once() == Completed(task_id, {"charge_id": "ch_ops"})
    assert CALLS == ["charge", "reconcile"]  # neither re-run nor reconciled again
    assert checkpoint_of(sqlite_store, task_id).journal[0].evidence == "resolved by ops: checked"


def test_resolving_an_ambiguous_effect_as_not_applied_reruns_it_with_the_same_key(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(idempotent=False, reconcile=_unknown)
    worker = make_worker(WorkflowDefinition(wf))
    task_id, key, _ = _fail_on_ambiguous_effect(sqlite_store, worker, clock, wf)

    sqlite_store.resolve_effect(
        task_id, key, applied=False, result_json=None, actor="ops", reason="no charge"
    )
    outcome = worker.run_once()

    assert isinstance(outcome, Completed)
    assert CALLS == ["charge", "reconcile", "charge"]
    assert KEYS == [key, key]


def test_not_applied_resolution_is_not_reused_after_the_rerun_is_interrupted_again(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(idempotent=False, reconcile=_unknown)
    worker = make_worker(WorkflowDefinition(wf))
    task_id, key, _ = _fail_on_ambiguous_effect(sqlite_store, worker, clock, wf)
    sqlite_store.resolve_effect(
        task_id, key, applied=False, result_json=None, actor="ops", reason="no charge"
    )

    STATE["charge_failure"] = SimulatedCrash()  # the re-run dies too: did it charge?
    with pytest.raises(SimulatedCrash):
        worker.run_once()
    clock.advance(31)
    outcome = worker.run_once()

    assert isinstance(outcome, Failed) and outcome.recoverable  # asked again, not re-run blindly
    assert CALLS == ["charge", "reconcile", "charge", "reconcile"]

    sqlite_store.resolve_effect(
        task_id, key, applied=True, result_json='{"charge_id": "ch_2nd"}', actor="ops", reason="found it"
    )
    assert worker.run_once() == Completed(task_id, {"charge_id": "ch_2nd"})
    assert CALLS == ["charge", "reconcile", "charge", "reconcile"]


def test_effect_resolution_is_recorded_in_history_with_actor_and_reason(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(idempotent=False)
    worker = make_worker(WorkflowDefinition(wf))
    task_id, key, _ = _fail_on_ambiguous_effect(sqlite_store, worker, clock, wf)
    sqlite_store.resolve_effect(task_id, key, applied=True, result_json="{}", actor="ops", reason="checked")

    resolved = [e for e in sqlite_store.history(task_id) if e.kind == "effect_resolved"]
    assert len(resolved) == 1
    assert resolved[0].detail == {"effect_key": key, "applied": True, "actor": "ops", "reason": "checked"}


def test_resolving_an_effect_of_a_task_that_did_not_fail_on_it_is_invalid_state(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = _effect_workflow(idempotent=False)
    queued = enqueue(sqlite_store, wf, {"order_id": "o1"})
    with pytest.raises(InvalidState, match="queued"):
        sqlite_store.resolve_effect(
            queued, f"{queued}/charge#1", applied=True, result_json=None, actor="ops", reason="checked"
        )

    assert isinstance(make_worker(WorkflowDefinition(wf)).run_once(), Completed)
    with pytest.raises(InvalidState, match="terminal"):
        sqlite_store.resolve_effect(
            queued, f"{queued}/charge#1", applied=True, result_json=None, actor="ops", reason="checked"
        )
    assert not [e for e in sqlite_store.history(queued) if e.kind == "effect_resolved"]


def test_resolving_with_the_wrong_effect_key_is_invalid_state(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _effect_workflow(idempotent=False)
    worker = make_worker(WorkflowDefinition(wf))
    task_id, key, _ = _fail_on_ambiguous_effect(sqlite_store, worker, clock, wf)
    with pytest.raises(InvalidState):
        sqlite_store.resolve_effect(
            task_id, f"{task_id}/other#1", applied=True, result_json=None, actor="ops", reason="checked"
        )
    assert sqlite_store.get_task(task_id).ambiguous_effect == key


# --- timers and slices --------------------------------------------------------------------------


def test_sleep_suspends_the_task_until_store_time_passes_the_due_time(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    worker = make_worker(WorkflowDefinition(with_sleep))
    task_id = enqueue(sqlite_store, with_sleep, {"order_id": "o1"})
    before = sqlite_store.now()

    outcome = worker.run_once()
    assert isinstance(outcome, Suspended)
    assert outcome.wake_at is not None
    assert within(outcome.wake_at, before + timedelta(seconds=60), sqlite_store.now() + timedelta(seconds=60))
    record = sqlite_store.get_task(task_id)
    assert record.state == TaskState.WAITING
    assert record.reason is not None and "timer" in record.reason
    assert record.ready_at == outcome.wake_at

    assert worker.run_once() == Idle()
    clock.advance(59)
    assert worker.run_once() == Idle()
    clock.advance(2)
    assert worker.run_once() == Completed(task_id, "o1:sku-1")
    assert journal_of(sqlite_store, task_id) == [
        ("reserve#1", "done"),
        ("timer#1", "done"),
        ("describe#1", "done"),
    ]


def test_sleep_until_a_past_deadline_continues_immediately(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = Workflow("past-deadline", 1)

    @wf.step()
    def after(ctx: StepContext) -> str:
        CALLS.append("after")
        return "done"

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        ctx.sleep_until(datetime(2000, 1, 1, tzinfo=UTC))
        return after(ctx)

    task_id = enqueue(sqlite_store, wf)
    assert make_worker(WorkflowDefinition(wf)).run_once() == Completed(task_id, "done")
    assert CALLS == ["after"]
    assert journal_of(sqlite_store, task_id) == [("timer#1", "done"), ("after#1", "done")]


def test_step_limit_per_claim_yields_after_each_step_and_still_completes(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(three_steps), max_steps_per_claim=1)
    task_id = enqueue(sqlite_store, three_steps, 4)

    assert worker.run_once() == Yielded(task_id)
    assert CALLS == ["a"]
    assert sqlite_store.get_task(task_id).state == TaskState.QUEUED
    assert worker.run_once() == Yielded(task_id)
    assert CALLS == ["a", "b"]
    assert worker.run_once() == Completed(task_id, 47)
    assert CALLS == ["a", "b", "c"]
    assert worker.run_once() == Idle()


def test_a_worker_told_to_hand_back_releases_its_task_at_the_next_boundary_with_the_reason(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    """What a pool's child does when its supervisor is gone: the step running when it is
    told finishes and is committed, the task is released (not counted as an attempt)
    before the next step, and any later claim of this worker is handed back the same way."""
    wf = Workflow("stop-soon", 1)

    @wf.step()
    def first(ctx: StepContext, value: int) -> int:
        CALLS.append("first")
        worker.hand_back_at_boundary("the supervisor is gone")  # as its signal handler would
        return value + 1

    @wf.step()
    def second(ctx: StepContext, value: int) -> int:
        CALLS.append("second")
        return value * 10

    @wf.main
    def main(ctx: WorkflowContext, start: int) -> int:
        return second(ctx, first(ctx, start))

    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, 4)
    assert worker.run_once() == Yielded(task_id)
    assert CALLS == ["first"]
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.claims_since_progress) == (TaskState.QUEUED, 0)
    assert sqlite_store.history(task_id)[-1].detail == {"reason": "the supervisor is gone"}
    assert journal_of(sqlite_store, task_id) == [("first#1", "done")]
    assert worker.run_once() == Yielded(task_id)  # still stopping: nothing new starts
    assert CALLS == ["first"]
    assert make_worker(WorkflowDefinition(wf)).run_once() == Completed(task_id, 50)
    assert CALLS == ["first", "second"]
    with pytest.raises(InvalidArgument, match="reason must be a string, got 5"):
        worker.hand_back_at_boundary(5)  # type: ignore[arg-type]


# --- leases -------------------------------------------------------------------------------------


def test_commit_with_a_lease_taken_over_by_another_worker_is_refused(
    sqlite_store: SqliteWorkflowStore, clock: Clock
) -> None:
    task_id = enqueue(sqlite_store, three_steps, 1)
    lease = LeaseDuration(timedelta(seconds=5))
    [first] = sqlite_store.claim(WorkerId.parse("first"), lease)
    assert sqlite_store.commit_checkpoint(first.lease, first.revision, '{"n": 1}').revision == 1

    clock.advance(6)
    [second] = sqlite_store.claim(WorkerId.parse("second"), lease)
    assert second.lease.fencing_token > first.lease.fencing_token

    with pytest.raises(LeaseLostError) as info:
        sqlite_store.commit_checkpoint(first.lease, 1, '{"n": "late"}')
    assert (info.value.task_id, info.value.fencing_token) == (task_id, first.lease.fencing_token)
    assert sqlite_store.commit_checkpoint(second.lease, second.revision, '{"n": 2}').revision == 2
    assert sqlite_store.get_task(task_id).checkpoint_json == '{"n": 2}'


def test_commit_after_the_lease_expired_is_refused_even_without_a_new_owner(
    sqlite_store: SqliteWorkflowStore, clock: Clock
) -> None:
    enqueue(sqlite_store, three_steps, 1)
    [claimed] = sqlite_store.claim(WorkerId.parse("first"), LeaseDuration(timedelta(seconds=5)))
    clock.advance(6)
    with pytest.raises(LeaseLostError):
        sqlite_store.commit_checkpoint(claimed.lease, claimed.revision, "{}")


def test_worker_whose_lease_was_taken_during_a_step_reports_lease_lost_and_writes_nothing(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = Workflow("slow", 1)

    @wf.step()
    def slow(ctx: StepContext) -> str:
        CALLS.append("slow")
        if "taken" not in STATE:
            clock.advance(31)  # the step outlives its lease...
            STATE["taken"] = sqlite_store.claim(WorkerId.parse("other"), LeaseDuration(timedelta(seconds=30)))
        return "late"

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return slow(ctx)

    task_id = enqueue(sqlite_store, wf)
    outcome = make_worker(WorkflowDefinition(wf)).run_once()

    assert outcome == LeaseLost(task_id, 1, "completed")  # the completion was refused
    assert len(STATE["taken"]) == 1
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.worker_id, record.fencing_token) == (TaskState.LEASED, "other", 2)
    assert record.revision == 0 and record.checkpoint_json is None


# --- enqueue and versions ---------------------------------------------------------------------


def test_enqueue_is_idempotent_on_the_checkpoint_id(sqlite_store: SqliteWorkflowStore) -> None:
    task = WorkflowTask.new("three-steps", 1, 5, checkpoint_id="order-5")
    first = sqlite_store.enqueue(task)
    again = sqlite_store.enqueue(WorkflowTask.new("three-steps", 1, 5, checkpoint_id="order-5"))
    assert (first.task_id, first.created) == ("order-5", True)
    assert (again.task_id, again.created) == ("order-5", False)
    assert [e.kind for e in sqlite_store.history("order-5")] == ["enqueued"]


@pytest.mark.parametrize(
    ("name", "version", "value", "difference"),
    [
        ("three-steps", 1, 6, "input"),
        ("three-steps", 2, 5, "definition version"),
        ("other", 1, 5, "definition name"),
    ],
)
def test_enqueue_with_the_same_checkpoint_id_and_other_content_is_a_conflict(
    sqlite_store: SqliteWorkflowStore, name: str, version: int, value: int, difference: str
) -> None:
    sqlite_store.enqueue(WorkflowTask.new("three-steps", 1, 5, checkpoint_id="order-5"))
    with pytest.raises(EnqueueConflict) as info:
        sqlite_store.enqueue(WorkflowTask.new(name, version, value, checkpoint_id="order-5"))
    assert info.value.differences == [difference]
    assert sqlite_store.get_task("order-5").input == 5


def _versioned(version: int) -> Workflow:
    wf = Workflow("versioned", version)

    @wf.step()
    def greet(ctx: StepContext, who: str) -> str:
        CALLS.append(f"greet v{version}")
        return f"v{version} hello {who}"

    @wf.main
    def main(ctx: WorkflowContext, who: str) -> str:
        CALLS.append(f"main v{version}")
        text = greet(ctx, who)
        ctx.sleep(timedelta(seconds=10))
        return text

    return wf


def test_task_suspended_on_version_1_completes_on_version_1_beside_version_2(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    v1, v2 = _versioned(1), _versioned(2)
    registry = WorkflowRegistry()
    worker = make_worker(WorkflowDefinition(v1), registry=registry)
    old_task = enqueue(sqlite_store, v1, "ada")
    assert isinstance(worker.run_once(), Suspended)

    registry.register(WorkflowDefinition(v2))  # deployed beside it
    new_task = enqueue(sqlite_store, v2, "bob")
    clock.advance(11)
    outcomes = [worker.run_once(), worker.run_once()]
    clock.advance(11)
    outcomes.append(worker.run_once())

    assert Completed(old_task, "v1 hello ada") in outcomes
    assert Completed(new_task, "v2 hello bob") in outcomes
    assert CALLS.count("main v1") == 2 and CALLS.count("greet v1") == 1
    assert CALLS.count("main v2") == 2 and CALLS.count("greet v2") == 1
    assert sqlite_store.get_task(old_task).definition_version == 1
