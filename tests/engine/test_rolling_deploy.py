"""A rolling deploy in which one worker runs a changed definition under the same version
(a step added, the version not bumped): the tasks its old steps checkpointed go back to
the queue naming both step fingerprints, never fail, and a worker with the original steps
completes every one; ``versions --app`` with the changed registry exits 1 naming it.
Before, the first claim by the wrong worker failed each task for good."""

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
from runifold_sync.outcomes import Completed, Idle, Suspended
from runifold_sync.store import TaskState
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

RAN: Counter[tuple[str, str]] = Counter()  # (task, step) bodies that ran


def invoice(extra_step: bool) -> Workflow:
    """``invoice`` v1 as released (charge, wait a day, send), or as a mistaken deploy
    changed it: a step added, the version kept."""
    workflow = Workflow("invoice", 1)

    @workflow.step()
    def charge(ctx: StepContext, amount: int) -> int:
        RAN[(ctx.task_id, "charge")] += 1
        return amount

    @workflow.step()
    def send(ctx: StepContext, amount: int) -> str:
        RAN[(ctx.task_id, "send")] += 1
        return f"sent {amount}"

    if extra_step:

        @workflow.step()
        def audit(ctx: StepContext, amount: int) -> int:
            RAN[(ctx.task_id, "audit")] += 1
            return amount

    @workflow.main
    def run(ctx: WorkflowContext, amount: int) -> str:
        charged = charge(ctx, amount)
        ctx.sleep(timedelta(hours=24))
        return send(ctx, charged)

    return workflow


def registry_of(workflow: Workflow) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    return registry


changed_registry = registry_of(invoice(extra_step=True))  # for ``versions --app``


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def worker(store: WorkflowStore, workflow: Workflow, name: str) -> WorkflowWorker:
    return WorkflowWorker(
        store, registry_of(workflow), WorkerId.parse(name), LeaseDuration(timedelta(seconds=30))
    )


def test_a_worker_with_changed_steps_leaves_the_tasks_to_the_right_worker(
    backend: Backend, store: WorkflowStore
) -> None:
    clock = Clock(store)
    released, changed = invoice(extra_step=False), invoice(extra_step=True)
    assert released.fingerprint() != changed.fingerprint()
    ids = [
        store.enqueue(WorkflowTask.new("invoice", 1, n, checkpoint_id=f"inv{n}")).task_id for n in range(3)
    ]
    old = worker(store, released, "old-release")
    assert [type(old.run_once()) for _ in ids] == [Suspended] * 3  # charged, waiting a day
    old.close()
    clock.advance(timedelta(hours=25))

    wrong, right = worker(store, changed, "wrong-deploy"), worker(store, released, "right-deploy")
    # The claim routes checkpointed tasks to the steps that wrote them: nothing is handed back.
    assert isinstance(wrong.run_once(), Idle)
    right.close()  # registered, then stopped: only the wrong deploy is live
    for task_id in ids:
        record = store.get_task(task_id)
        assert record.state is TaskState.WAITING and record.fingerprint == released.fingerprint()
        assert record.status_note is not None and released.fingerprint() in record.status_note
        assert not [e for e in store.history(task_id) if e.kind == "released"]
    right = worker(store, released, "right-deploy")
    assert [type(right.run_once()) for _ in ids] == [Completed] * 3
    wrong.close()
    right.close()
    for task_id in ids:
        assert store.get_task(task_id).state is TaskState.TERMINAL
        assert store.get_task(task_id).result == f"sent {task_id.removeprefix('inv')}"
    registered = {w.worker_id: w.fingerprints for w in store.workers()}
    assert registered["wrong-deploy"] == {("invoice", 1): changed.fingerprint()}
    assert registered["right-deploy"] == {("invoice", 1): released.fingerprint()}
    assert set(RAN.values()) == {1}  # each step body of each task ran once: none by the changed steps
    assert {step for _task, step in RAN} == {"charge", "send"}


def test_versions_with_an_app_that_changed_the_steps_of_a_version_exits_1_naming_it(
    backend: Backend, store: WorkflowStore
) -> None:
    released = invoice(extra_step=False)
    store.enqueue(WorkflowTask.new("invoice", 1, 5, checkpoint_id="inv5"))
    old = worker(store, released, "old-release")
    assert isinstance(old.run_once(), Suspended)
    old.close()
    app = "tests.engine.test_rolling_deploy:changed_registry"
    done = CliRunner().invoke(main, ["versions", "--app", app, "--database", backend.url, "--json"])
    assert done.exit_code == 1, done.output
    report = json.loads(done.output)
    assert report["missing"] == []
    [changed] = report["changed"]
    assert (changed["name"], changed["version"], changed["checkpointed"]) == (
        "invoice",
        1,
        [released.fingerprint()],
    )
    assert changed["app"] == changed_registry.get("invoice", 1).identity.fingerprint  # type: ignore[union-attr]
    text = CliRunner().invoke(main, ["versions", "--app", app, "--database", backend.url])
    assert text.exit_code == 1 and "CHANGED in app" in text.output and released.fingerprint() in text.output
