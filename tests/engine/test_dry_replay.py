"""The dry replay of ``versions --replay`` and ``testing.replay`` over every kind of
recorded call (steps, an effect, a timer, parallel branches with a patch inside one, a
child and its wait, a published event, a recorded time, a step failure caught): the
same code continues the run and runs no body; a change in the main function's calls is
found, naming the call, and one inside a finished parallel call is not a divergence (a
claim does not run its branches again)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowDefinition, WorkflowRegistry
from runifold_sync.errors import NonDeterminism, StepFailed
from runifold_sync.model.retry_policy import RetryPolicy
from runifold_sync.ops.run_export import export_run
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState
from runifold_sync.testing import replay, run_until_idle, send_signal

RAN: Counter[str] = Counter()


def flow(variant: str) -> Workflow:
    wf = Workflow("every-call", 1, signals=["go"])

    @wf.step()
    def a(ctx: StepContext, n: int) -> int:
        RAN["a"] += 1
        return n + 1

    @wf.effect(idempotent=True)
    def charge(ctx: StepContext, n: int) -> int:
        RAN["charge"] += 1
        return n * 2

    @wf.step(patch="left-extra")
    def extra(ctx: StepContext, n: int) -> int:
        RAN["extra"] += 1
        return n

    @wf.main
    def run(ctx: WorkflowContext, n: int) -> int:
        n = a(ctx, n)
        ctx.set_event("stage", "started")
        ctx.sleep(timedelta(minutes=5))

        def left(c: WorkflowContext) -> int:
            value = charge(c, n)
            if c.patched("left-extra"):
                value = extra(c, value)
            return value

        def right(c: WorkflowContext) -> int:
            return a(c, n) if variant != "branch-changed" else charge(c, n)

        both = ctx.parallel({"left": left, "right": right})
        child = ctx.start_child("every-call-child", 1, both["left"])
        got = ctx.wait_child(child)
        if variant == "main-changed":
            a(ctx, 0)
        ctx.wait_for_signal("go")
        return int(got) + both["right"]

    return wf


child_flow = Workflow("every-call-child", 1)


@child_flow.main
def child_main(ctx: WorkflowContext, n: int) -> int:
    return n + 100


def registry_of(variant: str) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow(variant)))
    registry.register(WorkflowDefinition(child_flow))
    return registry


def test_the_same_code_replays_every_kind_of_call_and_runs_nothing(sqlite_store: SqliteWorkflowStore) -> None:
    registry = registry_of("same")
    sqlite_store.enqueue(registry.task("every-call", 1, 1, checkpoint_id="all"))
    run_until_idle(sqlite_store, registry)
    assert sqlite_store.get_task("all").state is TaskState.WAITING  # for "go", every call before it done
    exported = export_run(sqlite_store, "all")
    RAN.clear()
    replay(exported, registry)
    assert not RAN
    # A finished parallel call returns its recorded results without running its
    # branches, in a claim as in the dry replay: a change inside them diverges nothing.
    replay(exported, registry_of("branch-changed"))
    with pytest.raises(NonDeterminism) as caught:
        replay(exported, registry_of("main-changed"))
    assert caught.value.requested == "a#2"
    send_signal(sqlite_store, "all", "go", None)
    run_until_idle(sqlite_store, registry)
    assert sqlite_store.get_task("all").result == 2 * 2 + 100 + 3


def test_a_parallel_call_still_running_has_its_branch_journals_checked(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    def racing(variant: str) -> WorkflowRegistry:
        wf = Workflow("fan", 1)

        @wf.step()
        def first(ctx: StepContext, n: int) -> int:
            RAN["first"] += 1
            return n

        @wf.step(retry=RetryPolicy(max_attempts=3, initial_backoff=timedelta(hours=1)))
        def flaky(ctx: StepContext, n: int) -> int:
            RAN["flaky"] += 1
            if RAN["flaky"] == 1:
                raise RuntimeError("first attempt fails")
            return n

        @wf.main
        def run(ctx: WorkflowContext, n: int) -> dict[str, int]:
            def left(c: WorkflowContext) -> int:
                return flaky(c, first(c, n)) if variant == "same" else flaky(c, n)

            return ctx.parallel({"left": left})

        registry = WorkflowRegistry()
        registry.register(WorkflowDefinition(wf))
        return registry

    same = racing("same")
    sqlite_store.enqueue(same.task("fan", 1, 3, checkpoint_id="fan1"))
    run_until_idle(sqlite_store, same, skip_time=False)  # first done, flaky to be retried in an hour
    assert sqlite_store.get_task("fan1").state is TaskState.QUEUED
    exported = export_run(sqlite_store, "fan1")
    RAN.clear()
    replay(exported, same)
    assert not RAN
    with pytest.raises(NonDeterminism) as caught:
        replay(exported, racing("changed"))
    assert (caught.value.recorded, caught.value.requested) == (
        "step parallel#1/left/first#1",
        "parallel#1/left/flaky#1",
    )


def test_a_caught_step_failure_and_a_recorded_time_replay_and_the_calls_after_them_are_checked(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    def fallback_flow(variant: str) -> WorkflowRegistry:
        wf = Workflow("fallback", 1, signals=["go"])

        @wf.step(retry=RetryPolicy(max_attempts=1))
        def primary(ctx: StepContext, n: int) -> int:
            RAN["primary"] += 1
            raise RuntimeError("the primary is down")

        @wf.step()
        def secondary(ctx: StepContext, n: int) -> int:
            RAN["secondary"] += 1
            return n

        @wf.main
        def run(ctx: WorkflowContext, n: int) -> int:
            ctx.now()
            try:
                value = primary(ctx, n)
            except StepFailed:
                value = secondary(ctx, n) if variant == "same" else primary(ctx, n + 1)
            ctx.wait_for_signal("go")
            return value

        registry = WorkflowRegistry()
        registry.register(WorkflowDefinition(wf))
        return registry

    same = fallback_flow("same")
    sqlite_store.enqueue(same.task("fallback", 1, 7, checkpoint_id="fb1"))
    run_until_idle(sqlite_store, same)
    assert sqlite_store.get_task("fb1").state is TaskState.WAITING
    exported = export_run(sqlite_store, "fb1")
    RAN.clear()
    replay(exported, same)  # past the recorded failure and time, to the wait: runs nothing
    assert not RAN
    with pytest.raises(NonDeterminism) as caught:
        replay(exported, fallback_flow("changed"))
    assert caught.value.requested == "primary#2"
