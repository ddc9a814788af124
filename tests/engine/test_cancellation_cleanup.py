"""Cleanup on cancellation, on every backend, run by real workers over real stores.

- A step called in a ``finally:`` block of the main function runs when a cancel unwinds
  it, as it does when a step's failure does: the cancel is delivered once, at a step
  boundary, and the steps the ``finally:`` block then calls run and are recorded. The task
  still ends cancelled, whatever the block then does (waits, or raises).
- A compensation declared ``with_args=True`` is given the arguments its step was called
  with (recorded when the step completed, structured back by the step's annotations),
  also in a later claim than the step's; arguments that are not JSON fail the task before
  the step runs.

(What a crash does to a ``finally:`` step, and why a compensation is the cleanup that
survives one, is in ``tests/system/test_verb_crash_points.py``.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.outcomes import Cancelled, Failed, Suspended
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.journals import entries
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

READER: list[WorkflowStore] = []  # the store a body cancels its own task through, as an operator would
RAN: Counter[str] = Counter()
UNDONE: list[Any] = []


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    READER.clear()
    RAN.clear()
    UNDONE.clear()
    yield
    READER.clear()


def run_once(store: WorkflowStore, workflow: Workflow, worker_id: str = "w1") -> Any:
    return run_cycle(store, WorkflowDefinition(workflow), worker_id=worker_id)


# --- finally: on cancellation as on failure ----------------------------------------------------

rental = Workflow("rental", 1)


@rental.step()
def reserve(ctx: StepContext, order: str) -> str:
    RAN["reserve"] += 1
    if order.startswith("cancel"):
        READER[0].cancel(ctx.task_id, "ops", "customer left")  # arrives while the task runs
    return f"res-{order}"


@rental.step(retry=RetryPolicy(max_attempts=1))
def ship(ctx: StepContext, reservation: str) -> str:
    RAN["ship"] += 1
    raise RuntimeError("no courier")


@rental.step()
def release(ctx: StepContext, reservation: str) -> str:
    RAN["release"] += 1
    return f"released {reservation}"


@rental.main
def rental_main(ctx: WorkflowContext, order: str) -> str:
    reservation = reserve(ctx, order)
    try:
        return ship(ctx, reservation)
    finally:
        release(ctx, reservation)
        if order == "cancel-then-wait":
            ctx.sleep(timedelta(hours=1))  # a wait while the cancel unwinds: the task still ends cancelled
        if order == "cancel-then-raise":
            raise ValueError("cleanup went wrong")


def _journal(store: WorkflowStore) -> list[str]:
    return [f"{e['call_id']}:{e['status']}" for e in entries(store, "t1")]


def test_a_finally_step_runs_on_failure(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("rental", 1, "fail", checkpoint_id="t1"))
    outcome = run_once(store, rental)
    assert isinstance(outcome, Failed) and outcome.cause == "step_error", outcome
    assert RAN == {"reserve": 1, "ship": 1, "release": 1}
    assert _journal(store) == ["reserve#1:done", "ship#1:failed", "release#1:done"]


@pytest.mark.parametrize("order", ["cancel", "cancel-then-wait", "cancel-then-raise"])
def test_a_finally_step_runs_on_cancellation_as_on_failure(backend: Backend, order: str) -> None:
    store = backend.open()
    READER.append(backend.open())
    store.enqueue(WorkflowTask.new("rental", 1, order, checkpoint_id="t1"))
    outcome = run_once(store, rental)
    assert isinstance(outcome, Cancelled), outcome
    assert RAN == {"reserve": 1, "release": 1}  # ship never began: the cancel came first
    assert _journal(store) == ["reserve#1:done", "release#1:done"]
    assert store.get_task("t1").reason == "cancelled by ops: customer left"


# --- compensations given the step's arguments ---------------------------------------------------


@attrs.frozen
class Room:
    number: int
    floor: str


hotel = Workflow("hotel", 1)


@hotel.step()
def book(ctx: StepContext, room: Room, nights: int, *, guest: str) -> str:
    RAN["book"] += 1
    return f"bk-{room.number}"


@hotel.compensate_for("book", with_args=True)
def unbook(ctx: StepContext, booking: str, room: Room, nights: int, *, guest: str) -> None:
    UNDONE.append((booking, room, nights, guest))


@hotel.step(retry=RetryPolicy(max_attempts=1))
def pay(ctx: StepContext, booking: str) -> str:
    raise RuntimeError("card declined")


@hotel.main
def hotel_main(ctx: WorkflowContext, order: dict[str, Any]) -> str:
    booking = book(ctx, Room(order["room"], "2nd"), order["nights"], guest=order["guest"])
    ctx.sleep(timedelta(minutes=1))  # the undo runs in a later claim than the step
    return pay(ctx, booking)


def test_a_compensation_is_given_the_steps_arguments_in_a_later_claim(backend: Backend, clock: Clock) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("hotel", 1, {"room": 12, "nights": 3, "guest": "ann"}, checkpoint_id="t1"))
    assert isinstance(run_once(store, hotel), Suspended)
    clock.advance(timedelta(minutes=2))
    outcome = run_once(store, hotel, "w2")
    assert isinstance(outcome, Failed), outcome
    assert UNDONE == [("bk-12", Room(12, "2nd"), 3, "ann")]  # structured back as the step's annotations
    assert outcome.reason.endswith("(compensated: book#1)")


bad_args = Workflow("bad-args", 1)


@bad_args.step()
def take(ctx: StepContext, thing: Any) -> str:
    RAN["take"] += 1
    return "taken"


@bad_args.compensate_for("take", with_args=True)
def give_back(ctx: StepContext, output: str, thing: Any) -> None:
    UNDONE.append(thing)


@bad_args.main
def bad_args_main(ctx: WorkflowContext, _: None) -> str:
    return take(ctx, float("nan"))  # NaN is no JSON value


def test_arguments_a_compensation_cannot_be_given_fail_before_the_step_runs(backend: Backend) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("bad-args", 1, None, checkpoint_id="t1"))
    outcome = run_once(store, bad_args)
    assert isinstance(outcome, Failed) and outcome.cause == "not_serializable", outcome
    assert "compensation of step 'take' takes its arguments" in outcome.reason
    assert RAN == {} and UNDONE == []


def test_with_args_is_part_of_the_fingerprint_and_checked() -> None:
    def declare(with_args: bool) -> str:
        wf = Workflow("fp", 1)

        @wf.step()
        def s(ctx: StepContext, x: int) -> int:
            return x

        @wf.compensate_for("s", with_args=with_args)
        def u(ctx: StepContext, out: int, x: int = 0) -> None:
            return None

        return wf.fingerprint()

    assert declare(True) != declare(False)
    with pytest.raises(Exception, match="with_args must be True or False, got 'yes'"):
        Workflow("fp", 1).compensate_for("s", with_args="yes")  # type: ignore[arg-type]
