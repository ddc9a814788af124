"""Signals, approvals and budgets in workflows, run by an in-process ``WorkflowWorker``
against a real SQLite file. Store time is moved with ``set_clock_offset``, never slept.

``SEEN`` records what the main function got back from each wait, replays included, so a
test can tell a recorded payload from a fresh one; ``CALLS`` records step bodies that ran.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    ApprovalDecision,
    ApprovalTimedOut,
    Budget,
    BudgetUsage,
    RetryPolicy,
    SignalTimedOut,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
)
from runifold_sync.errors import DefinitionConflict, SignalNotAccepted
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import Completed, Failed, Idle, Retried, Suspended
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import SignalCheck, TaskOutcome, TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support.backends import sqlite_clock
from tests.support.clock import Clock
from tests.support.workers import WorkerFactory

# The in-process worker tests move the clock of ``sqlite_store``.
clock = sqlite_clock

CALLS: list[str] = []
SEEN: list[Any] = []
LEASE_S = 30


@pytest.fixture(autouse=True)
def _reset_module_state() -> Iterator[None]:
    CALLS.clear()
    SEEN.clear()
    yield


def enqueue(store: SqliteWorkflowStore, wf: Workflow, value: Any = None) -> str:
    return store.enqueue(WorkflowTask.new(wf.name, wf.version, value)).task_id


def send(
    store: SqliteWorkflowStore,
    task_id: str,
    name: str,
    payload: Any,
    *,
    signal_id: str,
    sender: str = "alice",
) -> bool:
    return store.send_signal(task_id, name, payload, signal_id=signal_id, sender=sender).created


def checkpoint_of(store: SqliteWorkflowStore, task_id: str) -> Checkpoint:
    checkpoint = read_checkpoint(store, task_id)
    assert checkpoint is not None
    return checkpoint


def events(store: SqliteWorkflowStore, task_id: str, kind: str) -> list[dict[str, Any]]:
    return [e.detail for e in store.history(task_id) if e.kind == kind]


# --- workflows ------------------------------------------------------------------------------


@attrs.frozen
class Shipment:
    carrier: str
    tracking: str


def _two_waits() -> Workflow:
    wf = Workflow("two-waits", 1, signals=["go"])

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> list[Any]:
        first = ctx.wait_for_signal("go")
        SEEN.append(first)
        second = ctx.wait_for_signal("go")
        SEEN.append(second)
        return [first, second]

    return wf


def _shipping(timeout: timedelta | None = None) -> Workflow:
    wf = Workflow("shipping", 1, signals=["shipped"])

    @wf.step()
    def prepare(ctx: StepContext, order_id: str) -> str:
        CALLS.append("prepare")
        return f"parcel-{order_id}"

    @wf.main
    def main(ctx: WorkflowContext, order_id: str) -> dict[str, str]:
        parcel = prepare(ctx, order_id)
        shipment = ctx.wait_for_signal("shipped", timeout=timeout, payload_type=Shipment)
        SEEN.append(shipment)
        if isinstance(shipment, SignalTimedOut):
            return {"parcel": parcel, "status": "not shipped"}
        return {"parcel": parcel, "carrier": shipment.carrier, "tracking": shipment.tracking}

    return wf


def _waits_on_undeclared() -> Workflow:
    wf = Workflow("undeclared", 1, signals=["go"])

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> Any:
        return ctx.wait_for_signal("stop")

    return wf


def _expense(
    *,
    timeout: timedelta | None = None,
    escalate_to: tuple[str, ...] = (),
    escalation_timeout: timedelta | None = None,
) -> Workflow:
    wf = Workflow("expense", 1, signals=["approval"])

    @wf.main
    def main(ctx: WorkflowContext, amount: int) -> Any:
        decision = ctx.request_approval(
            "approval",
            approvers=["manager"],
            timeout=timeout,
            escalate_to=escalate_to,
            escalation_timeout=escalation_timeout,
        )
        SEEN.append(decision)
        return decision

    return wf


class SimulatedCrash(BaseException):
    """Escapes every ``except Exception``: the worker process 'dies' mid-step."""


def _consume_then(after: str) -> Workflow:
    """Takes signal "go", then either sleeps on a timer or crashes once in the next step."""
    wf = Workflow("consume-then", 1, signals=["go"])

    @wf.step()
    def finish(ctx: StepContext, payload: Any) -> str:
        CALLS.append("finish")
        if after == "crash" and CALLS.count("finish") == 1:
            raise SimulatedCrash()
        return f"finished with {payload}"

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        payload = ctx.wait_for_signal("go")
        SEEN.append(payload)
        if after == "timer":
            ctx.sleep(timedelta(seconds=60))
        return finish(ctx, payload)

    return wf


# --- signals ----------------------------------------------------------------------------


def test_a_signal_sent_twice_with_one_id_arrives_once_and_the_next_wait_takes_another(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_two_waits()))
    task_id = enqueue(sqlite_store, _two_waits())
    assert isinstance(worker.run_once(), Suspended)

    assert send(sqlite_store, task_id, "go", "first", signal_id="s1") is True
    assert send(sqlite_store, task_id, "go", "first", signal_id="s1") is False
    assert isinstance(worker.run_once(), Suspended)  # took s1 once, waits for the second
    assert SEEN == ["first"]
    assert sqlite_store.pending_signals(task_id, "go") == []

    # resent after it was consumed: still the same delivery, nothing wakes the task
    assert send(sqlite_store, task_id, "go", "first", signal_id="s1") is False
    assert worker.run_once() == Idle()

    send(sqlite_store, task_id, "go", "second", signal_id="s2")
    assert worker.run_once() == Completed(task_id, ["first", "second"])
    assert SEEN == ["first", "first", "second"]  # the first wait replays its recorded payload
    assert [d["signal_id"] for d in events(sqlite_store, task_id, "signal_consumed")] == ["s1", "s2"]
    assert len(events(sqlite_store, task_id, "signal_received")) == 2


def test_a_signal_sent_before_the_wait_is_consumed_without_suspending(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_shipping()))
    task_id = enqueue(sqlite_store, _shipping(), "o1")
    send(sqlite_store, task_id, "shipped", {"carrier": "dhl", "tracking": "T1"}, signal_id="s1")

    outcome = worker.run_once()

    assert outcome == Completed(task_id, {"parcel": "parcel-o1", "carrier": "dhl", "tracking": "T1"})
    kinds = [e.kind for e in sqlite_store.history(task_id)]
    assert "suspended" not in kinds
    assert kinds.count("claimed") == 1
    assert events(sqlite_store, task_id, "signal_consumed")[0]["signal_id"] == "s1"


def test_wait_for_signal_suspends_until_the_signal_wakes_it_with_a_structured_payload(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_shipping()))
    task_id = enqueue(sqlite_store, _shipping(), "o1")

    outcome = worker.run_once()
    assert isinstance(outcome, Suspended)
    assert outcome.wake_at is None
    assert "'shipped'" in outcome.reason
    record = sqlite_store.get_task(task_id)
    assert record.state is TaskState.WAITING
    assert record.reason is not None and "'shipped'" in record.reason
    assert worker.run_once() == Idle()  # no timer: only the signal wakes it

    send(sqlite_store, task_id, "shipped", {"carrier": "ups", "tracking": "1Z"}, signal_id="s1")
    woken = sqlite_store.get_task(task_id)
    assert woken.ready_at is not None and woken.ready_at <= sqlite_store.now()  # claimable at once

    assert worker.run_once() == Completed(
        task_id, {"parcel": "parcel-o1", "carrier": "ups", "tracking": "1Z"}
    )
    assert SEEN == [Shipment("ups", "1Z")]
    assert CALLS == ["prepare"]  # the step before the wait replayed, not re-ran


def test_wait_for_signal_returns_signal_timed_out_once_store_time_passes_the_timeout(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _shipping(timeout=timedelta(seconds=60))
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, "o1")

    before = sqlite_store.now()
    outcome = worker.run_once()
    assert isinstance(outcome, Suspended)
    assert outcome.wake_at is not None
    assert before + timedelta(seconds=60) <= outcome.wake_at <= sqlite_store.now() + timedelta(seconds=60)

    clock.advance(59)
    assert worker.run_once() == Idle()
    clock.advance(2)
    assert worker.run_once() == Completed(task_id, {"parcel": "parcel-o1", "status": "not shipped"})
    assert SEEN == [SignalTimedOut("shipped")]


def test_waiting_on_an_undeclared_signal_fails_the_task_naming_the_signal(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_waits_on_undeclared()))
    task_id = enqueue(sqlite_store, _waits_on_undeclared())

    outcome = worker.run_once()

    assert isinstance(outcome, Failed)
    assert "signal 'stop' is not declared" in outcome.reason
    record = sqlite_store.get_task(task_id)
    assert (record.state, record.outcome, record.reason) == (
        TaskState.TERMINAL,
        TaskOutcome.FAILED,
        outcome.reason,
    )


def test_declared_signal_names_are_part_of_the_fingerprint() -> None:
    def build(signals: list[str]) -> Workflow:
        wf = Workflow("fp", 1, signals=signals)

        @wf.main
        def main(ctx: WorkflowContext, _input: None) -> None:
            return None

        return wf

    assert build([]).fingerprint() != build(["go"]).fingerprint()
    assert build(["go"]).fingerprint() != build(["stop"]).fingerprint()
    assert build(["a", "b"]).fingerprint() == build(["b", "a"]).fingerprint()

    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(build(["go"])))
    with pytest.raises(DefinitionConflict, match="'fp' version 1 is already registered"):
        registry.register(WorkflowDefinition(build(["go", "stop"])))


# --- approvals ----------------------------------------------------------------------------


def test_an_approval_from_a_non_approver_is_refused_where_it_is_sent_and_an_approvers_decision_is_returned(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_expense()))
    task_id = enqueue(sqlite_store, _expense(), 500)
    assert isinstance(worker.run_once(), Suspended)

    with pytest.raises(SignalNotAccepted, match="'intern' is not an approver of 'approval'") as refused:
        send(sqlite_store, task_id, "approval", {"approved": True}, signal_id="a1", sender="intern")
    assert refused.value.field == "sender"
    assert sqlite_store.pending_signals(task_id) == []
    assert worker.run_once() == Idle()  # not woken for a decision it would refuse
    (recorded,) = events(sqlite_store, task_id, "signal_refused")
    assert (recorded["signal_id"], recorded["sender"]) == ("a1", "intern")
    assert "its approvers now: manager" in recorded["refused"]

    send(
        sqlite_store,
        task_id,
        "approval",
        {"approved": False, "reason": "too much"},
        signal_id="a2",
        sender="manager",
    )
    outcome = worker.run_once()

    decision = ApprovalDecision("approval", "manager", False, "too much", escalated=False)
    assert SEEN == [decision]
    assert outcome == Completed(task_id, attrs.asdict(decision))


def test_an_approval_from_a_non_approver_sent_before_the_wait_is_kept_and_refused_by_the_wait(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_expense()))
    task_id = enqueue(sqlite_store, _expense(), 500)

    # Before any claim the store knows neither the definition nor who will approve.
    delivery = sqlite_store.send_signal(
        task_id, "approval", {"approved": True}, signal_id="a1", sender="intern"
    )
    assert delivery.checked is SignalCheck.UNCHECKED
    assert isinstance(worker.run_once(), Suspended)
    (refused,) = events(sqlite_store, task_id, "signal_refused")
    assert (refused["signal_id"], refused["sender"]) == ("a1", "intern")
    assert "'intern' is not an approver of 'approval'" in refused["note"]
    assert SEEN == []


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        ({"approved": "yes"}, "an approval payload must be"),
        ("approve", "an approval payload must be"),
        ({"approved": True, "reason": 5}, "an approval reason must be text"),
    ],
)
def test_a_malformed_approval_payload_is_refused_even_from_an_approver(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, payload: Any, problem: str
) -> None:
    worker = make_worker(WorkflowDefinition(_expense()))
    task_id = enqueue(sqlite_store, _expense(), 500)
    send(sqlite_store, task_id, "approval", payload, signal_id="early", sender="manager")
    assert isinstance(worker.run_once(), Suspended)  # the wait refuses the one sent before it
    (early,) = events(sqlite_store, task_id, "signal_refused")
    assert (early["signal_id"], early["sender"]) == ("early", "manager")
    assert problem in early["note"]

    with pytest.raises(SignalNotAccepted, match=problem) as refused:  # the store, once it waits
        send(sqlite_store, task_id, "approval", payload, signal_id="bad", sender="manager")
    assert refused.value.field == "payload"
    assert [e["signal_id"] for e in events(sqlite_store, task_id, "signal_refused")] == ["early", "bad"]
    assert SEEN == []

    send(sqlite_store, task_id, "approval", {"approved": True}, signal_id="good", sender="manager")
    assert isinstance(worker.run_once(), Completed)
    assert SEEN == [ApprovalDecision("approval", "manager", True, None)]


def test_an_approval_timeout_escalates_and_only_the_escalation_approver_decides(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _expense(
        timeout=timedelta(seconds=60), escalate_to=("director",), escalation_timeout=timedelta(seconds=120)
    )
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, 5000)
    assert isinstance(worker.run_once(), Suspended)

    clock.advance(61)
    escalated = worker.run_once()
    assert isinstance(escalated, Suspended)
    assert escalated.wake_at is not None
    assert escalated.wake_at >= sqlite_store.now() + timedelta(seconds=119)

    with pytest.raises(SignalNotAccepted, match="'manager' is not an approver .* now: director"):
        send(
            sqlite_store,
            task_id,
            "approval",
            {"approved": True, "reason": "late"},
            signal_id="m1",
            sender="manager",
        )
    (refused,) = events(sqlite_store, task_id, "signal_refused")
    assert refused["signal_id"] == "m1"

    send(
        sqlite_store,
        task_id,
        "approval",
        {"approved": True, "reason": "ok"},
        signal_id="d1",
        sender="director",
    )
    assert isinstance(worker.run_once(), Completed)
    assert SEEN == [ApprovalDecision("approval", "director", True, "ok", escalated=True)]


def test_an_approval_times_out_after_the_escalation_times_out(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _expense(
        timeout=timedelta(seconds=60), escalate_to=("director",), escalation_timeout=timedelta(seconds=120)
    )
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf, 5000)
    worker.run_once()
    clock.advance(61)
    assert isinstance(worker.run_once(), Suspended)
    clock.advance(119)
    assert worker.run_once() == Idle()
    clock.advance(2)

    outcome = worker.run_once()

    assert SEEN == [ApprovalTimedOut("approval", escalated=True)]
    assert outcome == Completed(task_id, {"name": "approval", "escalated": True})


def test_an_approval_without_escalation_times_out_unescalated(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _expense(timeout=timedelta(seconds=60))
    worker = make_worker(WorkflowDefinition(wf))
    enqueue(sqlite_store, wf, 10)
    worker.run_once()
    clock.advance(61)
    assert isinstance(worker.run_once(), Completed)
    assert SEEN == [ApprovalTimedOut("approval", escalated=False)]


# --- replay -------------------------------------------------------------------------------


def test_replay_after_a_suspension_returns_the_recorded_payload_without_consuming_again(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _consume_then("timer")
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf)
    send(sqlite_store, task_id, "go", "one", signal_id="s1")
    assert isinstance(worker.run_once(), Suspended)  # consumed s1, then the timer

    send(sqlite_store, task_id, "go", "two", signal_id="s2")
    assert worker.run_once() == Idle()  # a timer wait is not woken by a signal
    clock.advance(61)

    assert worker.run_once() == Completed(task_id, "finished with one")
    assert SEEN == ["one", "one"]
    assert [d["signal_id"] for d in events(sqlite_store, task_id, "signal_consumed")] == ["s1"]
    assert [s.signal_id for s in sqlite_store.pending_signals(task_id, "go")] == ["s2"]


def test_replay_after_a_crash_following_consumption_returns_the_recorded_payload(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _consume_then("crash")
    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf)
    send(sqlite_store, task_id, "go", "one", signal_id="s1")

    with pytest.raises(SimulatedCrash):
        worker.run_once()
    assert [(e.call_id, e.status) for e in checkpoint_of(sqlite_store, task_id).journal] == [
        ("signal:go#1", "done")
    ]
    send(sqlite_store, task_id, "go", "two", signal_id="s2")
    clock.advance(LEASE_S + 1)  # the dead worker's lease expires

    assert worker.run_once() == Completed(task_id, "finished with one")
    assert SEEN == ["one", "one"]
    assert CALLS == ["finish", "finish"]
    assert len(events(sqlite_store, task_id, "signal_consumed")) == 1
    assert [s.signal_id for s in sqlite_store.pending_signals(task_id, "go")] == ["s2"]


# --- budgets ------------------------------------------------------------------------------


def _spender(cost_a: float, cost_b: float, *, sleep_between: bool) -> Workflow:
    wf = Workflow("spender", 1)

    @wf.step()
    def a(ctx: StepContext) -> None:
        CALLS.append("a")
        ctx.charge(cost_a)

    @wf.step()
    def b(ctx: StepContext) -> None:
        CALLS.append("b")
        ctx.charge(cost_b)

    @wf.step()
    def c(ctx: StepContext) -> None:
        CALLS.append("c")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        a(ctx)
        if sleep_between:
            ctx.sleep(timedelta(seconds=10))
        b(ctx)
        c(ctx)

    return wf


def test_exhausting_max_cost_fails_the_task_before_the_next_step_runs(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = _spender(2, 2.5, sleep_between=False)
    worker = make_worker(WorkflowDefinition(wf, budget=Budget(max_cost=3)))
    task_id = enqueue(sqlite_store, wf)

    outcome = worker.run_once()

    assert isinstance(outcome, Failed)
    assert "max_cost=3" in outcome.reason and "4.5" in outcome.reason
    assert CALLS == ["a", "b"]  # b over-spent and is recorded; c never started
    checkpoint = checkpoint_of(sqlite_store, task_id)
    assert [e.call_id for e in checkpoint.journal] == ["a#1", "b#1"]
    assert checkpoint.usage.cost == 4.5
    assert sqlite_store.get_task(task_id).reason == outcome.reason


def test_cost_charged_in_an_earlier_claim_counts_against_max_cost(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _spender(2, 2, sleep_between=True)
    worker = make_worker(WorkflowDefinition(wf, budget=Budget(max_cost=3)))
    enqueue(sqlite_store, wf)
    assert isinstance(worker.run_once(), Suspended)
    clock.advance(11)

    outcome = worker.run_once()

    assert isinstance(outcome, Failed) and "max_cost=3" in outcome.reason
    assert CALLS == ["a", "b"]


def test_usage_in_the_checkpoint_never_decreases_across_claims(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = Workflow("metered", 1, signals=["go"])

    @wf.step()
    def first(ctx: StepContext) -> None:
        ctx.charge(1)

    @wf.step(retry=RetryPolicy(max_attempts=2, initial_backoff=timedelta(seconds=5), jitter=0))
    def flaky(ctx: StepContext) -> None:
        ctx.charge(1)  # charged on the failed attempt too
        if ctx.attempt == 1:
            raise ConnectionError("upstream down")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        first(ctx)
        ctx.sleep(timedelta(seconds=10))
        flaky(ctx)
        ctx.wait_for_signal("go")

    worker = make_worker(WorkflowDefinition(wf))
    task_id = enqueue(sqlite_store, wf)
    usages: list[BudgetUsage] = []

    def run_and_record(expected: type) -> None:
        assert isinstance(worker.run_once(), expected)
        usages.append(checkpoint_of(sqlite_store, task_id).usage)

    run_and_record(Suspended)  # first, then the timer
    clock.advance(11)
    run_and_record(Retried)  # flaky failed once
    clock.advance(6)
    run_and_record(Suspended)  # flaky succeeded, waiting for "go"
    send(sqlite_store, task_id, "go", None, signal_id="s1")
    run_and_record(Completed)

    for earlier, later in zip(usages, usages[1:], strict=False):
        assert later.covers(earlier), (earlier, later)
    assert [u.claims for u in usages] == [1, 2, 3, 4]
    assert (usages[-1].steps, usages[-1].cost) == (2, 3)


def _slow_main(pause_s: float, *, wait: bool) -> Workflow:
    """Step a, then ``pause_s`` of wall time in the main function itself (optionally
    after a durable timer), then step b."""
    wf = Workflow("slow-main", 1)

    @wf.step()
    def a(ctx: StepContext) -> None:
        CALLS.append("a")

    @wf.step()
    def b(ctx: StepContext) -> None:
        CALLS.append("b")

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        a(ctx)
        if wait:
            ctx.sleep(timedelta(seconds=10))
        else:
            time.sleep(pause_s)
        b(ctx)

    return wf


def test_max_duration_counts_wall_time_while_claimed_not_only_step_bodies(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = _slow_main(0.5, wait=False)
    worker = make_worker(WorkflowDefinition(wf, budget=Budget(max_duration=timedelta(seconds=0.3))))
    task_id = enqueue(sqlite_store, wf)

    outcome = worker.run_once()

    assert isinstance(outcome, Failed)
    assert outcome.reason.startswith("budget max_duration=0:00:00.300000 exceeded (")
    assert outcome.reason.endswith("s of run time)")
    assert CALLS == ["a"]  # b never started
    usage = checkpoint_of(sqlite_store, task_id).usage
    assert usage.elapsed_s >= 0.5 and usage.steps == 1
    assert sqlite_store.get_task(task_id).reason == outcome.reason


def test_max_duration_does_not_count_time_spent_waiting(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory, clock: Clock
) -> None:
    wf = _slow_main(0.0, wait=True)
    worker = make_worker(WorkflowDefinition(wf, budget=Budget(max_duration=timedelta(seconds=2))))
    task_id = enqueue(sqlite_store, wf)
    assert isinstance(worker.run_once(), Suspended)
    waited_since = time.monotonic()
    while time.monotonic() - waited_since < 2.5:  # longer than the whole budget, but waiting
        time.sleep(0.1)
    clock.advance(11)

    assert worker.run_once() == Completed(task_id, None)
    assert CALLS == ["a", "b"]
    assert checkpoint_of(sqlite_store, task_id).usage.elapsed_s < 2


# --- regressions: approvers as a string, payloads that do not fit -----------------------


def test_approvers_given_as_a_string_do_not_let_its_letters_approve(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    wf = Workflow("string-approvers", 1, signals=["approval"])

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> Any:
        decision = ctx.request_approval("approval", approvers="manager")
        SEEN.append(decision)
        return decision

    worker = make_worker(WorkflowDefinition(wf))
    enqueue(sqlite_store, wf)

    outcome = worker.run_once()

    assert isinstance(outcome, Failed), outcome
    assert "approvers must be a list of names, got the string 'manager'" in outcome.reason
    assert SEEN == []


def test_a_payload_that_does_not_fit_payload_type_is_refused_and_the_wait_goes_on(
    sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory
) -> None:
    worker = make_worker(WorkflowDefinition(_shipping()))
    task_id = enqueue(sqlite_store, _shipping(), "o1")
    worker.run_once()
    send(sqlite_store, task_id, "shipped", {"carrier": "dhl"}, signal_id="bad")

    assert isinstance(worker.run_once(), Suspended)
    (refused,) = events(sqlite_store, task_id, "signal_refused")
    assert refused["signal_id"] == "bad"

    send(sqlite_store, task_id, "shipped", {"carrier": "dhl", "tracking": "T1"}, signal_id="good")
    assert worker.run_once() == Completed(
        task_id, {"parcel": "parcel-o1", "carrier": "dhl", "tracking": "T1"}
    )
