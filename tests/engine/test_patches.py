"""``ctx.patched``: a change guarded by a patch keeps the definition's fingerprint, so the
tasks in flight go on under the new code; a run that was past the patch point keeps the
old path, a run that reaches it takes the new one and records the marker, and a worker
still on the old code hands a marked task back instead of failing it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

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
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.checkpoint import Checkpoint
from runifold_sync.outcomes import Completed, DefinitionUnavailable, Suspended
from runifold_sync.store import TaskState
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

RAN: Counter[tuple[str, str]] = Counter()


def shipping(stage: str) -> Workflow:
    """``ship`` v1: pack, wait a day, send. ``stage`` "old" as released; "patched" adds a
    fraud check behind ``ctx.patched("fraud-check")`` before the wait *and* an insurance
    step behind ``ctx.patched("insure")`` after it; "deprecated" keeps only the new path
    of "fraud-check" through ``deprecate_patch``."""
    workflow = Workflow("ship", 1)

    @workflow.step()
    def pack(ctx: StepContext, n: int) -> int:
        RAN[(ctx.task_id, "pack")] += 1
        return n

    @workflow.step()
    def send(ctx: StepContext, n: int) -> str:
        RAN[(ctx.task_id, "send")] += 1
        return f"sent {n}"

    if stage != "old":

        @workflow.step(patch="fraud-check")
        def fraud_check(ctx: StepContext, n: int) -> int:
            RAN[(ctx.task_id, "fraud_check")] += 1
            return n

        @workflow.step(patch="insure")
        def insure(ctx: StepContext, n: int) -> int:
            RAN[(ctx.task_id, "insure")] += 1
            return n

    @workflow.main
    def run(ctx: WorkflowContext, n: int) -> str:
        packed = pack(ctx, n)
        if stage == "patched":
            if ctx.patched("fraud-check"):
                packed = fraud_check(ctx, packed)
                assert ctx.patched("fraud-check")  # the first answer stands
        elif stage == "deprecated":
            ctx.deprecate_patch("fraud-check")
            packed = fraud_check(ctx, packed)
        ctx.sleep(timedelta(hours=24))
        if stage != "old" and ctx.patched("insure"):
            packed = insure(ctx, packed)
        return send(ctx, packed)

    return workflow


def worker(store: WorkflowStore, workflow: Workflow, name: str) -> WorkflowWorker:
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    return WorkflowWorker(store, registry, WorkerId.parse(name), LeaseDuration(timedelta(seconds=30)))


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


def markers(store: WorkflowStore, task_id: str) -> list[str]:
    record = store.get_task(task_id)
    assert record.checkpoint_json is not None
    checkpoint = Checkpoint.decode(task_id, record.checkpoint_json, store.read_journal(task_id))
    return [e.call_id for e in checkpoint.journal if e.kind == "patch"]


def test_a_patch_keeps_the_fingerprint_and_old_runs_keep_the_old_path(
    backend: Backend, store: WorkflowStore
) -> None:
    clock = Clock(store)
    old, patched = shipping("old"), shipping("patched")
    assert old.fingerprint() == patched.fingerprint()  # patch-guarded steps are compatible
    assert patched.patches == {"fraud-check", "insure"}
    store.enqueue(WorkflowTask.new("ship", 1, 1, checkpoint_id="before"))
    first = worker(store, old, "old-code")
    assert isinstance(first.run_once(), Suspended)  # packed and waiting under the old code
    first.close()

    new = worker(store, patched, "new-code")
    store.enqueue(WorkflowTask.new("ship", 1, 2, checkpoint_id="after"))
    assert isinstance(new.run_once(), Suspended)  # the new run: pack, fraud check, wait
    clock.advance(timedelta(hours=25))
    assert {type(new.run_once()), type(new.run_once())} == {Completed}
    new.close()
    # "before" was past the fraud check point without its marker: old path there; it
    # reached "insure" for the first time under the new code, so it took that one.
    assert store.get_task("before").result == "sent 1"
    assert RAN[("before", "fraud_check")] == 0 and RAN[("before", "insure")] == 1
    assert markers(store, "before") == ["patch:insure"]
    assert RAN[("after", "fraud_check")] == 1 and RAN[("after", "insure")] == 1
    assert markers(store, "after") == ["patch:fraud-check", "patch:insure"]
    assert set(RAN.values()) == {1}  # no body ran twice


def test_an_old_worker_hands_back_a_task_that_took_a_patched_path(
    backend: Backend, store: WorkflowStore
) -> None:
    clock = Clock(store)
    store.enqueue(WorkflowTask.new("ship", 1, 3, checkpoint_id="marked"))
    new = worker(store, shipping("patched"), "new-code")
    assert isinstance(new.run_once(), Suspended)
    new.close()
    clock.advance(timedelta(hours=25))
    old = worker(store, shipping("old"), "old-code")
    outcome = old.run_once()
    old.close()
    assert isinstance(outcome, DefinitionUnavailable), outcome
    record = store.get_task("marked")
    assert record.state is TaskState.QUEUED and record.outcome is None
    released = [e for e in store.history("marked") if e.kind == "released"]
    assert released and "patch:fraud-check" in str(released[-1].detail)
    clock.advance(timedelta(minutes=5))
    new = worker(store, shipping("deprecated"), "newer-code")  # deprecation passes the marker
    assert isinstance(new.run_once(), Completed)
    new.close()
    assert store.get_task("marked").result == "sent 3"
    assert set(RAN.values()) == {1}


def test_a_deprecated_patch_records_no_marker_on_new_runs(backend: Backend, store: WorkflowStore) -> None:
    clock = Clock(store)
    store.enqueue(WorkflowTask.new("ship", 1, 4, checkpoint_id="fresh"))
    new = worker(store, shipping("deprecated"), "newer-code")
    assert isinstance(new.run_once(), Suspended)
    clock.advance(timedelta(hours=25))
    assert isinstance(new.run_once(), Completed)
    new.close()
    assert RAN[("fresh", "fraud_check")] == 1
    assert markers(store, "fresh") == ["patch:insure"]


@pytest.mark.parametrize("bad", ["", " x", "a#b", "a/b", 7, "x" * 201])
def test_a_bad_change_id_is_refused_naming_it(bad: object) -> None:
    workflow = Workflow("bad-patch", 1)
    with pytest.raises(InvalidArgument, match="patch change id"):
        workflow.step(patch=bad)  # type: ignore[arg-type]
