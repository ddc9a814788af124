"""Parallel branches and races, in-process, on SQLite and on PostgreSQL (where branch
threads commit through the store's shared connection pool)."""

from __future__ import annotations

import re
import threading
import time
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    Budget,
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
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import Completed, Failed
from runifold_sync.store.checkpoints import read_checkpoint

LEASE = LeaseDuration(timedelta(seconds=30))


@attrs.frozen
class Total:
    value: int


def _worker(store: WorkflowStore, workflow: Workflow, budget: Budget | None = None) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow, budget or Budget()))
    return WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=5))


def _checkpoint(store: WorkflowStore, task_id: str) -> Checkpoint:
    checkpoint = read_checkpoint(store, task_id)
    assert checkpoint is not None
    return checkpoint


def _parallel_workflow(ran: list[str], fail_once: set[str]) -> Workflow:
    workflow = Workflow("parallel-flow", 1)

    @workflow.step()
    def add(ctx: StepContext, value: int) -> int:
        ran.append(ctx.call_id)
        if ctx.call_id in fail_once:
            fail_once.discard(ctx.call_id)
            raise RuntimeError("transient")
        return value + 1

    def left(bctx: WorkflowContext) -> Total:
        return Total(add(bctx, add(bctx, 0)))

    def right(bctx: WorkflowContext) -> int:
        return add(bctx, 100)

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> dict[str, Any]:
        results = ctx.parallel({"left": left, "right": right})
        assert isinstance(results["left"], Total)
        return {"left": results["left"].value, "right": results["right"]}

    return workflow


def test_parallel_branches_run_with_scoped_step_ids_and_typed_results(
    store: WorkflowStore,
) -> None:
    ran: list[str] = []
    worker = _worker(store, _parallel_workflow(ran, set()))
    store.enqueue(WorkflowTask.new("parallel-flow", 1, None, checkpoint_id="p1"))
    assert worker.run_once() == Completed("p1", {"left": 2, "right": 101})
    assert sorted(ran) == ["parallel#1/left/add#1", "parallel#1/left/add#2", "parallel#1/right/add#1"]
    checkpoint = _checkpoint(store, "p1")
    assert set(checkpoint.branch_journals) == {"parallel#1/left", "parallel#1/right"}
    assert checkpoint.usage.steps == 3
    # One revision sequence: a step's result is committed before the next body in any
    # branch runs, and each finished branch's result with or after its last step (how
    # many commits that takes depends on how the branches interleave), then the parallel
    # entry, then completion with nothing left unsaved.
    assert 3 <= store.get_task("p1").revision <= 6


def test_a_retried_parallel_run_does_not_rerun_the_finished_branch(store: WorkflowStore) -> None:
    ran: list[str] = []
    worker = _worker(store, _parallel_workflow(ran, {"parallel#1/left/add#2"}))
    store.enqueue(WorkflowTask.new("parallel-flow", 1, None, checkpoint_id="p2"))
    assert worker.run_once().kind == "retried"
    store.set_clock_offset(timedelta(minutes=5))
    assert worker.run_once() == Completed("p2", {"left": 2, "right": 101})
    assert ran.count("parallel#1/right/add#1") == 1  # the finished branch replayed
    assert ran.count("parallel#1/left/add#1") == 1
    assert ran.count("parallel#1/left/add#2") == 2  # failed once, then ran again


def test_reservations_the_budget_cannot_cover_are_refused_before_any_branch_starts(
    store: WorkflowStore,
) -> None:
    ran: list[str] = []
    workflow = Workflow("reserving", 1)

    @workflow.step()
    def touch(ctx: StepContext) -> None:
        ran.append(ctx.call_id)

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        touch(ctx)
        ctx.parallel(
            {"a": lambda b: touch(b), "b": lambda b: touch(b)},
            reserve={"a": Budget(max_cost=6), "b": Budget(max_cost=5)},
        )

    worker = _worker(store, workflow, Budget(max_cost=10))
    store.enqueue(WorkflowTask.new("reserving", 1, None, checkpoint_id="r1"))
    outcome = worker.run_once()
    assert isinstance(outcome, Failed)
    assert "reserve max_cost=11 but only 10 of the task's budget remains" in outcome.reason
    assert ran == ["touch#1"]


def test_a_branch_that_overspends_its_reservation_fails_the_task(store: WorkflowStore) -> None:
    workflow = Workflow("overspend", 1)

    @workflow.step()
    def spend(ctx: StepContext) -> None:
        ctx.charge(3)

    def greedy(bctx: WorkflowContext) -> None:
        spend(bctx)
        spend(bctx)

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        ctx.parallel({"greedy": greedy}, reserve={"greedy": Budget(max_cost=4)})

    worker = _worker(store, workflow, Budget(max_cost=100))
    store.enqueue(WorkflowTask.new("overspend", 1, None, checkpoint_id="o1"))
    outcome = worker.run_once()
    assert isinstance(outcome, Failed)
    assert "branch 'parallel#1/greedy' reserve: budget max_cost=4 exceeded" in outcome.reason


def test_waits_inside_a_branch_fail_the_task_with_a_clear_reason(store: WorkflowStore) -> None:
    workflow = Workflow("waiting-branch", 1)

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        ctx.parallel({"sleepy": lambda b: b.sleep(timedelta(seconds=1))})

    worker = _worker(store, workflow)
    store.enqueue(WorkflowTask.new("waiting-branch", 1, None, checkpoint_id="w1"))
    outcome = worker.run_once()
    assert isinstance(outcome, Failed) and "durable waits belong in the main function" in outcome.reason


def _race_workflow(store: WorkflowStore, ran: list[str], safe: list[str]) -> Workflow:
    workflow = Workflow("race-flow", 1)
    plodding = threading.Event()
    writing = threading.Event()

    @workflow.step()
    def quick(ctx: StepContext) -> str:
        # Win while the slow branch is inside its first step and the effect's body runs.
        assert plodding.wait(10) and writing.wait(10)
        ran.append(ctx.call_id)
        return "quick"

    @workflow.step()
    def plod(ctx: StepContext) -> None:
        ran.append(ctx.call_id)
        plodding.set()
        time.sleep(0.2)

    @workflow.effect(idempotent=False)
    def write(ctx: StepContext) -> str:
        ran.append(ctx.call_id)
        writing.set()
        assert _await_winner(store, ctx.task_id) == "quick"  # still in flight when the race is won
        return "written"

    @workflow.step()
    def record_receipt(ctx: StepContext, receipt: str) -> str:
        ran.append(ctx.call_id)
        return f"{receipt}, receipt kept"

    def slow(bctx: WorkflowContext) -> str:
        for _ in range(5):
            plod(bctx)
        return "slow"

    def effect(bctx: WorkflowContext) -> str:
        # A step after the effect: only a loser that is left to finish reaches it.
        return record_receipt(bctx, write(bctx))

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> list[Any]:
        winner, result = ctx.race(
            {"quick": lambda b: quick(b), "slow": slow, "effect": effect}, cancel_safe=safe
        )
        return [winner, result]

    return workflow


@pytest.mark.timeout(30)
def test_race_records_the_first_success_and_stops_only_safe_losers(store: WorkflowStore) -> None:
    ran: list[str] = []
    worker = _worker(store, _race_workflow(store, ran, ["slow"]))
    store.enqueue(WorkflowTask.new("race-flow", 1, None, checkpoint_id="race1"))
    assert worker.run_once() == Completed("race1", ["quick", "quick"])
    # The safe loser stopped at a step boundary; the unsafe one held an in-flight
    # non-idempotent effect and was left to finish.
    assert ran.count("race#1/slow/plod#1") == 1 and "race#1/slow/plod#5" not in ran
    assert ran.count("race#1/effect/write#1") == 1
    assert ran.count("race#1/effect/record_receipt#1") == 1  # it ran on past the effect
    checkpoint = _checkpoint(store, "race1")
    race = checkpoint.journal[0]
    assert race.output["winner"] == "quick"
    assert race.output["superseded"] == ["effect"] and race.output["cancelled"] == ["slow"]
    receipt = checkpoint.branch_journals["race#1/effect"][-1]
    assert (receipt.call_id, receipt.status, receipt.output) == (
        "race#1/effect/record_receipt#1",
        "done",
        "written, receipt kept",
    )


def _sharing(costs: dict[str, list[float]], reserve: dict[str, Budget]) -> Workflow:
    """Branches run one at a time in ``costs`` order, each charging its costs in steps."""
    workflow = Workflow("sharing", 1)

    @workflow.step()
    def spend(ctx: StepContext, cost: float) -> None:
        ctx.charge(cost)

    def branch(charges: list[float]) -> Any:
        def run(bctx: WorkflowContext) -> None:
            for cost in charges:
                spend(bctx, cost)

        return run

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        ctx.parallel({key: branch(c) for key, c in costs.items()}, reserve=reserve, max_threads=1)

    return workflow


def test_an_unreserved_branch_cannot_spend_what_a_running_sibling_reserved(
    store: WorkflowStore,
) -> None:
    workflow = _sharing({"b": [3, 3, 3], "a": [2]}, {"a": Budget(max_cost=6)})
    worker = _worker(store, workflow, Budget(max_cost=10))
    store.enqueue(WorkflowTask.new("sharing", 1, None, checkpoint_id="s1"))

    outcome = worker.run_once()

    assert isinstance(outcome, Failed)
    assert outcome.reason == (
        "branch 'parallel#1/b' is unreserved and may not spend what its siblings reserved "
        "(0 steps, cost 6 still held): budget max_cost=10 exceeded (cost 12) counting the reservations"
    )
    checkpoint = _checkpoint(store, "s1")
    assert checkpoint.usage.cost == 6  # b's second step is recorded, its third never ran
    assert checkpoint.branch_journals.get("parallel#1/a", []) == []  # a never ran a step


def test_a_reserved_branch_spends_its_whole_share_after_an_unreserved_one_took_the_rest(
    store: WorkflowStore,
) -> None:
    workflow = _sharing({"b": [2, 2], "a": [3, 3]}, {"a": Budget(max_cost=6)})
    worker = _worker(store, workflow, Budget(max_cost=10))
    store.enqueue(WorkflowTask.new("sharing", 1, None, checkpoint_id="s2"))

    assert worker.run_once() == Completed("s2", None)
    checkpoint = _checkpoint(store, "s2")
    assert checkpoint.usage.cost == 10
    assert checkpoint.branch_usage["parallel#1/a"].cost == 6


def test_a_finished_branch_frees_its_unspent_share_for_its_siblings(
    store: WorkflowStore,
) -> None:
    workflow = _sharing({"a": [2], "b": [4, 4]}, {"a": Budget(max_cost=6)})
    worker = _worker(store, workflow, Budget(max_cost=10))
    store.enqueue(WorkflowTask.new("sharing", 1, None, checkpoint_id="s3"))

    assert worker.run_once() == Completed("s3", None)
    assert _checkpoint(store, "s3").usage.cost == 10


def test_a_branch_that_finished_before_a_retry_neither_runs_again_nor_holds_its_share(
    store: WorkflowStore,
) -> None:
    ran: list[str] = []
    failed_once: list[bool] = []
    workflow = Workflow("resumed-shares", 1)

    @workflow.step()
    def work(ctx: StepContext, pause_s: float) -> None:
        ran.append(ctx.call_id)
        time.sleep(pause_s)
        if ctx.call_id.endswith("b/work#3") and not failed_once:
            failed_once.append(True)
            raise RuntimeError("transient")

    def a(bctx: WorkflowContext) -> str:
        work(bctx, 0.0)
        time.sleep(0.3)  # plain code after its one step: a finishes well before b
        return "a"

    def b(bctx: WorkflowContext) -> str:
        work(bctx, 0.5)
        work(bctx, 0.0)
        work(bctx, 0.0)
        return "b"

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> Any:
        return ctx.parallel({"a": a, "b": b}, reserve={"a": Budget(max_steps=3)})

    worker = _worker(store, workflow, Budget(max_steps=4))
    store.enqueue(WorkflowTask.new("resumed-shares", 1, None, checkpoint_id="r1"))
    assert worker.run_once().kind == "retried"
    store.set_clock_offset(timedelta(minutes=5))
    # On the resumed claim a's share would leave b only one step; a finished, so none is held.
    assert worker.run_once() == Completed("r1", {"a": "a", "b": "b"})
    assert ran.count("parallel#1/a/work#1") == 1
    assert ran.count("parallel#1/b/work#3") == 2
    assert _checkpoint(store, "r1").usage.steps == 4


def test_a_duration_share_longer_than_the_run_time_left_is_refused_up_front(
    store: WorkflowStore,
) -> None:
    workflow = _sharing({"a": [1], "b": [1]}, {"a": Budget(max_duration=timedelta(seconds=5))})
    worker = _worker(store, workflow, Budget(max_duration=timedelta(seconds=2)))
    store.enqueue(WorkflowTask.new("sharing", 1, None, checkpoint_id="s4"))

    outcome = worker.run_once()

    assert isinstance(outcome, Failed)
    assert re.fullmatch(
        r"parallel branch 'a' reserves max_duration=0:00:05 but only [12]\.\d{3}s of the task's run "
        r"time remains",
        outcome.reason,
    ), outcome.reason
    assert _checkpoint(store, "s4").branch_journals == {}


class SimulatedCrash(BaseException):
    """Escapes every ``except Exception``: the worker process 'dies' mid-step."""


def _recorded_winner(store: WorkflowStore, task_id: str) -> str | None:
    """The winner of the task's first journal entry (its race), once committed."""
    checkpoint = read_checkpoint(store, task_id)
    if checkpoint is None:
        return None
    journal = checkpoint.journal
    return None if not journal or journal[0].output is None else journal[0].output.get("winner")


def _await_winner(store: WorkflowStore, task_id: str) -> str | None:
    deadline = time.monotonic() + 20
    while (winner := _recorded_winner(store, task_id)) is None and time.monotonic() < deadline:
        time.sleep(0.02)
    return winner


def _replayed_race(store: WorkflowStore, ran: list[str], after: str) -> Workflow:
    """A race that "fast" wins ("slow" finishes once the winner is committed), then either
    a durable timer or a step that crashes its worker once."""
    workflow = Workflow("race-replay", 1)

    @workflow.step()
    def pick(ctx: StepContext, name: str) -> str:
        ran.append(ctx.call_id)
        if name == "slow":
            _await_winner(store, ctx.task_id)
        return name

    @workflow.step()
    def finish(ctx: StepContext, winner: str) -> str:
        ran.append(ctx.call_id)
        if after == "crash" and ran.count(ctx.call_id) == 1:
            raise SimulatedCrash()
        return f"won by {winner}"

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        winner, result = ctx.race({"fast": lambda b: pick(b, "fast"), "slow": lambda b: pick(b, "slow")})
        if after == "timer":
            ctx.sleep(timedelta(seconds=60))
        return finish(ctx, f"{winner}:{result}")

    return workflow


@pytest.mark.timeout(60)
@pytest.mark.parametrize("after", ["timer", "crash"])
def test_race_replay_returns_the_recorded_winner_without_running_branches_again(
    store: WorkflowStore, after: str
) -> None:
    ran: list[str] = []
    worker = _worker(store, _replayed_race(store, ran, after))
    store.enqueue(WorkflowTask.new("race-replay", 1, None, checkpoint_id="rr"))
    if after == "timer":
        assert worker.run_once().kind == "suspended"
        store.set_clock_offset(timedelta(seconds=61))
    else:
        with pytest.raises(SimulatedCrash):
            worker.run_once()
        store.set_clock_offset(timedelta(seconds=31))  # the dead worker's lease expires
    branch_calls = sorted(c for c in ran if c.startswith("race#1/"))
    assert branch_calls == ["race#1/fast/pick#1", "race#1/slow/pick#1"]

    assert worker.run_once() == Completed("rr", "won by fast:fast")
    assert sorted(c for c in ran if c.startswith("race#1/")) == branch_calls  # none ran again
    race = _checkpoint(store, "rr").journal[0]
    assert (race.call_id, race.output["winner"], race.output["superseded"]) == ("race#1", "fast", ["slow"])


@pytest.mark.timeout(60)
def test_a_race_loser_with_a_non_idempotent_effect_in_flight_is_not_cancelled_and_is_superseded(
    store: WorkflowStore,
) -> None:
    workflow = Workflow("race-in-flight", 1)
    in_flight = threading.Event()
    winner_seen_while_in_flight: list[str] = []
    writes: list[str] = []

    @workflow.step()
    def quick(ctx: StepContext) -> str:
        assert in_flight.wait(20)  # the effect is running before the winner is decided
        return "quick"

    @workflow.effect(idempotent=False)
    def charge_card(ctx: StepContext) -> str:
        writes.append(ctx.call_id)
        in_flight.set()
        winner_seen_while_in_flight.append(str(_await_winner(store, ctx.task_id)))
        return "charged"

    @workflow.step()
    def record_receipt(ctx: StepContext, charge: str) -> str:
        writes.append(ctx.call_id)
        return f"receipt for {charge}"

    def charge(bctx: WorkflowContext) -> str:
        # The step after the effect is what a cancelled loser would never reach.
        return record_receipt(bctx, charge_card(bctx))

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> list[Any]:
        winner, result = ctx.race({"quick": lambda b: quick(b), "charge": charge})
        return [winner, result]

    worker = _worker(store, workflow)
    store.enqueue(WorkflowTask.new("race-in-flight", 1, None, checkpoint_id="rf"))

    assert worker.run_once() == Completed("rf", ["quick", "quick"])
    assert winner_seen_while_in_flight == ["quick"]  # decided and durable while it ran
    # The effect ran once and the loser went on to its next step: it was not stopped.
    assert writes == ["race#1/charge/charge_card#1", "race#1/charge/record_receipt#1"]
    checkpoint = _checkpoint(store, "rf")
    race = checkpoint.journal[0]
    assert (race.output["superseded"], race.output["cancelled"]) == (["charge"], [])
    effect, receipt = checkpoint.branch_journals["race#1/charge"]
    assert [(e.call_id, e.status, e.output) for e in (effect, receipt)] == [
        ("race#1/charge/charge_card#1", "done", "charged"),
        ("race#1/charge/record_receipt#1", "done", "receipt for charged"),
    ]


@pytest.mark.timeout(60)
def test_parallel_runs_at_most_max_threads_branches_at_once(store: WorkflowStore) -> None:
    workflow = Workflow("bounded", 1)
    lock = threading.Lock()
    running = [0]
    peak = [0]

    @workflow.step()
    def occupy(ctx: StepContext) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.15)
        with lock:
            running[0] -= 1

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        ctx.parallel({f"b{n}": lambda b: occupy(b) for n in range(6)}, max_threads=2)

    worker = _worker(store, workflow)
    store.enqueue(WorkflowTask.new("bounded", 1, None, checkpoint_id="bd"))

    assert worker.run_once() == Completed("bd", None)
    assert peak[0] == 2
    assert _checkpoint(store, "bd").usage.steps == 6


def _one(bctx: WorkflowContext) -> int:
    return 1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda ctx: ctx.parallel([_one]),
            "parallel branches must be a dict of name -> function, got [<function _one at ",
        ),
        (
            lambda ctx: ctx.parallel({"a": _one}, reserve=5),
            "reserve must be a dict of branch name -> Budget, got 5",
        ),
        (
            lambda ctx: ctx.parallel({"a": _one}, reserve={"a": 5}),
            "reserve of branch 'a' must be a Budget, got 5",
        ),
        (
            lambda ctx: ctx.race({"a": _one}, cancel_safe="a"),
            "cancel_safe must be a list of branch names, got 'a'",
        ),
        (
            lambda ctx: ctx.race({"a": _one}, cancel_safe=5),
            "cancel_safe must be a list of branch names, got 5",
        ),
    ],
    ids=[
        "branches-list",
        "reserve-number",
        "reserve-share-number",
        "cancel-safe-string",
        "cancel-safe-number",
    ],
)
def test_parallel_and_race_arguments_of_the_wrong_shape_fail_the_task_naming_them(
    store: WorkflowStore, call: Any, message: str
) -> None:
    # Before: a bare AttributeError ('list' object has no attribute 'items') or TypeError.
    workflow = Workflow("shapes", 1)

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> Any:
        return call(ctx)

    store.enqueue(WorkflowTask.new("shapes", 1, None, checkpoint_id="s1"))
    worker = _worker(store, workflow)
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
    assert isinstance(outcome, Failed), outcome
    assert outcome.reason.startswith(f"workflow main raised InvalidArgument: {message}"), outcome.reason
