"""Repairing runs on every store: a fork from step 3 of a five-step run replays the calls
before it (their effects ran once in all) and runs the rest anew, the original untouched
and both linked; a fork at or after an effect of unknown outcome is refused naming it; a
cancelled task resumes from its checkpoint unless its cancellation compensated; and a
redrive of 200 failed tasks by filter, dry first, in bounded batches, audited per task."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from click.testing import CliRunner

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
from runifold_sync.cli.main import main
from runifold_sync.errors import InvalidArgument, InvalidState
from runifold_sync.model.retry_policy import RetryPolicy
from runifold_sync.model.values import TaskOutcome
from runifold_sync.outcomes import Completed, Failed, Suspended
from runifold_sync.store import TaskState
from runifold_sync.store.repair_records import TaskSelector
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

RAN: Counter[tuple[str, str]] = Counter()  # (task, call) bodies that ran
FLAGS: dict[str, object] = {}


class Crash(BaseException):
    """The worker process dies inside the effect's body (its intent is committed)."""


five = Workflow("five", 1, signals=["go"])


@five.effect(idempotent=False)
def s1(ctx: StepContext, n: int) -> int:
    RAN[(ctx.task_id, "s1")] += 1
    return n + 1


@five.effect(idempotent=True)
def s2(ctx: StepContext, n: int) -> int:
    RAN[(ctx.task_id, "s2")] += 1
    return n + 1


@five.step()
def s3(ctx: StepContext, n: int) -> int:
    RAN[(ctx.task_id, "s3")] += 1
    return n + 1


@five.effect(idempotent=False)
def s4(ctx: StepContext, n: int) -> int:
    RAN[(ctx.task_id, "s4")] += 1
    if FLAGS.get("crash_s4"):
        raise Crash()
    return n + 1


@five.step(retry=RetryPolicy(max_attempts=1))
def s5(ctx: StepContext, n: int) -> int:
    RAN[(ctx.task_id, "s5")] += 1
    if FLAGS.get("fail_s5"):
        raise RuntimeError("s5 broke")
    return n + 1


@five.main
def run_five(ctx: WorkflowContext, n: int) -> int:
    n = s3(ctx, s2(ctx, s1(ctx, n)))
    if FLAGS.get("wait"):
        ctx.wait_for_signal("go")
    return s5(ctx, s4(ctx, n))


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(five))


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    FLAGS.clear()
    yield
    RAN.clear()
    FLAGS.clear()


def worker(store: WorkflowStore) -> WorkflowWorker:
    return WorkflowWorker(store, registry, WorkerId.parse("repairs"), LeaseDuration(timedelta(seconds=30)))


def test_a_fork_from_step_3_replays_the_calls_before_it_and_runs_the_rest(
    backend: Backend, store: WorkflowStore
) -> None:
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="orig"))
    w = worker(store)
    assert w.run_once() == Completed("orig", 5)
    before = store.get_task("orig")
    forked = store.fork(
        "orig", from_step="s3", input=None, actor="ops", reason="s3 had a bug", new_task_id="f1"
    )
    assert forked == "f1"
    assert w.run_once() == Completed("f1", 5)
    w.close()
    # Effects s1, s2 ran once in all (the fork replayed them); s3..s5 once per task.
    assert {
        call: sum(n for (_t, c), n in RAN.items() if c == call) for call in ("s1", "s2", "s3", "s4", "s5")
    } == {
        "s1": 1,
        "s2": 1,
        "s3": 2,
        "s4": 2,
        "s5": 2,
    }
    assert RAN[("f1", "s1")] == 0 and RAN[("f1", "s3")] == 1
    after = store.get_task("orig")  # untouched
    assert (after.state, after.result, after.revision) == (before.state, before.result, before.revision)
    forked_from = [e.detail for e in store.history("f1") if e.kind == "forked_from"]
    assert forked_from == [{"task": "orig", "from_step": "s3", "actor": "ops", "reason": "s3 had a bug"}]
    assert [e.detail["task"] for e in store.history("orig") if e.kind == "forked"] == ["f1"]
    shown = json.loads(CliRunner().invoke(main, ["show", "orig", "--json", "--database", backend.url]).output)
    assert any(h["kind"] == "forked" and h["detail"]["task"] == "f1" for h in shown["history"])
    assert shown["forks"] == ["f1"] and shown["forked_from"] is None
    forked_shown = json.loads(
        CliRunner().invoke(main, ["show", "f1", "--json", "--database", backend.url]).output
    )
    assert forked_shown["forked_from"] == "orig"
    text = CliRunner().invoke(main, ["show", "f1", "--database", backend.url]).output
    assert "forked from: orig at s3" in text


def test_a_fork_takes_a_new_input_and_names_an_unknown_step(backend: Backend, store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="orig2"))
    w = worker(store)
    w.run_once()
    new_id = store.fork("orig2", from_step="s1#1", input=10, actor="ops", reason="rerun with 10")
    assert new_id.startswith("orig2.fork-")
    assert w.run_once() == Completed(new_id, 15)
    w.close()
    with pytest.raises(InvalidArgument, match="recorded no call 's9#1'.*s1#1, s2#1"):
        store.fork("orig2", from_step="s9", actor="ops", reason="x")
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="never-ran"))
    with pytest.raises(InvalidState, match="has not run yet"):
        store.fork("never-ran", from_step="s1", actor="ops", reason="x")


def test_a_fork_at_or_after_an_effect_of_unknown_outcome_is_refused(
    backend: Backend, store: WorkflowStore
) -> None:
    clock = Clock(store)
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="amb"))
    w = worker(store)
    FLAGS["crash_s4"] = True
    with pytest.raises(Crash):
        w.run_once()
    FLAGS.clear()
    clock.advance(timedelta(seconds=31))
    outcome = w.run_once()
    assert isinstance(outcome, Failed) and outcome.recoverable
    for at in ("s4", "s5"):
        with pytest.raises(InvalidState, match=r"effect 's4#1' \(call 3\) has an unknown outcome"):
            store.fork("amb", from_step="s4" if at == "s4" else "s4#1", actor="ops", reason="x")
    forked = store.fork(
        "amb", from_step="s3", actor="ops", reason="before the unknown effect", new_task_id="amb2"
    )
    assert w.run_once() == Completed(forked, 5)
    w.close()
    assert RAN[("amb", "s1")] == 1 and RAN[("amb2", "s1")] == 0


def test_a_cancelled_task_resumes_from_its_checkpoint(backend: Backend, store: WorkflowStore) -> None:
    FLAGS["wait"] = True
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="c1"))
    w = worker(store)
    assert isinstance(w.run_once(), Suspended)
    assert store.cancel("c1", "ops", "wrong customer") is TaskState.CANCELLED
    assert store.resume_cancelled("c1", actor="ops", reason="right customer after all") is TaskState.QUEUED
    with pytest.raises(InvalidState, match="queued, not cancelled"):
        store.resume_cancelled("c1", actor="ops", reason="again")
    store.send_signal("c1", "go", None, signal_id="go-c1", sender="ops")
    assert isinstance(w.run_once(), Suspended | Completed)
    while store.get_task("c1").state is not TaskState.TERMINAL:
        w.run_once()
    w.close()
    assert store.get_task("c1").result == 5
    assert RAN[("c1", "s1")] == 1 and RAN[("c1", "s3")] == 1  # replayed, not re-run
    resumed = [e.detail for e in store.history("c1") if e.kind == "resumed"]
    assert resumed == [{"from": "cancelled", "actor": "ops", "reason": "right customer after all"}]


def test_a_cancel_that_compensated_is_not_resumed(backend: Backend, store: WorkflowStore) -> None:
    flow = Workflow("undoable", 1, signals=["go"])

    @flow.step()
    def book(ctx: StepContext, n: int) -> int:
        return n

    @flow.compensate_for("book")
    def unbook(ctx: StepContext, booked: int) -> None:
        RAN[(ctx.task_id, "unbook")] += 1

    @flow.main
    def run(ctx: WorkflowContext, n: int) -> int:
        book(ctx, n)
        ctx.wait_for_signal("go")
        return n

    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(flow))
    w = WorkflowWorker(store, reg, WorkerId.parse("undo"), LeaseDuration(timedelta(seconds=30)))
    store.enqueue(WorkflowTask.new("undoable", 1, 1, checkpoint_id="u1"))
    assert isinstance(w.run_once(), Suspended)
    store.cancel("u1", "ops", "stop")
    w.run_once()  # runs the compensation, ends it cancelled
    w.close()
    assert store.get_task("u1").state is TaskState.CANCELLED and RAN[("u1", "unbook")] == 1
    with pytest.raises(InvalidState, match="its cancellation ran compensations"):
        store.resume_cancelled("u1", actor="ops", reason="x")


def test_a_redrive_of_200_failed_tasks_by_filter(backend: Backend, store: WorkflowStore) -> None:
    FLAGS["fail_s5"] = True
    ids = [f"r{n:03d}" for n in range(200)]
    store.enqueue_many([WorkflowTask.new("five", 1, n, checkpoint_id=t) for n, t in enumerate(ids)])
    store.enqueue(WorkflowTask.new("five", 1, 0, checkpoint_id="other", tenant="elsewhere"))
    w = worker(store)
    for _ in range(201):
        assert isinstance(w.run_once(), Failed)
    selector = TaskSelector(
        definition="five", version=1, outcome=TaskOutcome.FAILED, reason_contains="s5 broke", tenant="default"
    )
    dry = store.retry_where(selector, actor="ops", reason="s5 fixed", dry_run=True)
    assert (dry.matched, dry.changed, dry.first) == (200, 0, tuple(ids[:20]))
    assert all(store.get_task(t).state is TaskState.TERMINAL for t in ids)  # a dry run changes nothing
    seen: list[tuple[int, int]] = []
    FLAGS.clear()  # the fix is deployed
    done = store.retry_where(
        selector, actor="ops", reason="s5 fixed", batch=64, progress=lambda a, b: seen.append((a, b))
    )
    assert (done.matched, done.changed, done.skipped_count) == (200, 200, 0)
    assert seen == [(64, 200), (128, 200), (192, 200), (200, 200)]
    assert store.get_task("other").state is TaskState.TERMINAL  # another tenant: not selected
    for task_id in ids[:3]:
        requeued = [e for e in store.history(task_id) if e.kind == "requeued"]
        assert len(requeued) == 1 and requeued[0].detail == {"actor": "ops", "reason": "s5 fixed"}
    for _ in range(200):
        assert isinstance(w.run_once(), Completed)
    w.close()
    assert [store.get_task(t).result for t in ids[:3]] == [5, 6, 7]
    assert RAN[("r000", "s1")] == 1 and RAN[("r000", "s5")] == 2  # only the failed step ran again
    again = store.retry_where(selector, actor="ops", reason="again")
    assert again.matched == 0 and again.changed == 0


def test_cancel_by_filter_skips_finished_tasks(backend: Backend, store: WorkflowStore) -> None:
    FLAGS["wait"] = True
    store.enqueue_many([WorkflowTask.new("five", 1, n, checkpoint_id=f"k{n}") for n in range(5)])
    w = worker(store)
    for _ in range(5):
        assert isinstance(w.run_once(), Suspended)
    store.send_signal("k0", "go", None, signal_id="go-k0", sender="ops")
    assert w.run_once() == Completed("k0", 5)
    w.close()
    done = store.cancel_where(TaskSelector(definition="five"), actor="ops", reason="recall", batch=2)
    assert (done.matched, done.changed, done.skipped_count) == (5, 4, 1)
    assert done.skipped == (("k0", "terminal: finished"),)
    assert [store.get_task(f"k{n}").state for n in range(1, 5)] == [TaskState.CANCELLED] * 4


def test_a_selector_needs_a_filter_and_checks_each_field() -> None:
    with pytest.raises(InvalidArgument, match="at least one of"):
        TaskSelector()
    with pytest.raises(InvalidArgument, match=r"filter version must be an integer in 1\.\.\d+, got 0$"):
        TaskSelector(definition="five", version=0)
    with pytest.raises(InvalidArgument, match="filter state must be a TaskState"):
        TaskSelector(state="failed")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="filter since must be a timezone-aware"):
        TaskSelector(definition="x", since="yesterday")  # type: ignore[arg-type]
