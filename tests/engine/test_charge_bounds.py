"""``ctx.charge`` takes a finite cost and the task's total stays finite, on SQLite and
PostgreSQL. Before, ``charge(float("inf"))`` (or two steps of 1e308 each) was accepted,
every later commit failed with a bare ``ValueError`` (usage is stored as JSON, which has
no infinity), the task stayed leased and its body re-ran until it failed as a crash
loop; ``charge(10**400)`` raised ``OverflowError``, which was retried."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runifold_sync import (
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.outcomes import Failed, Idle
from runifold_sync.store import TaskOutcome, TaskState
from tests.support.backends import contract_backend
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

RUNS: list[str] = []


@pytest.fixture(autouse=True)
def _reset_runs() -> Iterator[None]:
    RUNS.clear()
    yield


def _charging(*costs: Any, catch: bool = False) -> Workflow:
    """One step per cost, each charging it (``catch``: the body swallows a refusal)."""
    wf = Workflow("charging", 1)
    steps = []
    for number, cost in enumerate(costs):

        @wf.step(step_id=f"s{number}")
        def spend(ctx: StepContext, cost: Any = cost, number: int = number) -> None:
            RUNS.append(f"s{number}")
            try:
                ctx.charge(cost)
            except ValueError:
                if not catch:
                    raise

        steps.append(spend)

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        for step in steps:
            step(ctx)

    return wf


def _fails_once(store: WorkflowStore, wf: Workflow) -> Failed:
    """Run ``wf``'s task: it fails in its first cycle, and nothing is left to claim."""
    task_id = store.enqueue(WorkflowTask.new(wf.name, wf.version, None)).task_id
    definition = WorkflowDefinition(wf)
    outcome = run_cycle(store, definition)
    assert isinstance(outcome, Failed), outcome
    assert run_cycle(store, definition) == Idle()
    task = store.get_task(task_id)
    assert (task.state, task.outcome, task.reason) == (TaskState.TERMINAL, TaskOutcome.FAILED, outcome.reason)
    return outcome


@pytest.mark.parametrize(
    ("cost", "shown"),
    [(float("inf"), "inf"), (float("nan"), "nan"), (10**400, "an integer of 1329 bits"), ("5", "'5'")],
    ids=["inf", "nan", "huge-int", "string"],
)
def test_a_refused_cost_fails_the_task_at_once_naming_it(store: WorkflowStore, cost: Any, shown: str) -> None:
    outcome = _fails_once(store, _charging(cost))

    assert outcome.reason == (
        f"step 's0' was refused a charge: charge cost must be a finite number >= 0, got {shown}; "
        "not retried: every attempt would charge it again"
    )
    assert outcome.cause == "misuse"
    assert RUNS == ["s0"]  # run once, not retried


def test_a_refused_charge_the_body_catches_fails_the_task_all_the_same(store: WorkflowStore) -> None:
    outcome = _fails_once(store, _charging(float("inf"), catch=True))

    assert "charge cost must be a finite number >= 0, got inf" in outcome.reason
    assert RUNS == ["s0"]


def test_charges_in_one_body_adding_up_past_the_largest_float_are_refused_at_the_charge(
    store: WorkflowStore,
) -> None:
    wf = Workflow("twice", 1)

    @wf.step()
    def spend(ctx: StepContext) -> None:
        RUNS.append("spend")
        ctx.charge(1e308)
        ctx.charge(1e308)

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> None:
        spend(ctx)

    outcome = _fails_once(store, wf)

    assert "charge cost 1e+308 added to 1e+308 already counted is past the largest float" in outcome.reason
    assert RUNS == ["spend"]


def test_steps_whose_costs_add_up_past_the_largest_float_fail_the_task_naming_the_cost(
    store: WorkflowStore,
) -> None:
    outcome = _fails_once(store, _charging(1e308, 1e308))

    assert outcome.reason == (
        "budget usage cannot be counted: cost 1e+308 added to 1e+308 already counted is past the "
        "largest float (1.79769e+308): a total cost must stay finite"
    )
    assert outcome.cause == "budget"
    assert RUNS == ["s0", "s1"]  # each body once
