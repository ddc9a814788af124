"""A task checkpointed by the engine of schema version 6 (one text holding the whole
journal) continues after the upgrade: migration 0007 splits the journal into rows in
place, and the new engine replays it.

The text below is what that code stored for this workflow while it waited on its timer,
after a step, an effect, a signal, a parallel call and a race: format version 1, every
journal entry kind but the effect intent. It is written into a database built with the
migrations up to version 6, the store is opened (which migrates it), and the task must
finish without running any recorded call again, on both backends.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
)
from runifold_sync.errors import CheckpointError
from runifold_sync.model.checkpoint import Checkpoint, EntryKind, EntryStatus
from runifold_sync.store import TaskState
from runifold_sync.store.checkpoints import read_checkpoint
from tests.support.backends import Backend
from tests.support.old_schema import schema_at

LEGACY_TEXT = (
    '{"branch_journals":{"parallel#1/x":[{"call_id":"parallel#1/x/add#1","due":null,'
    '"evidence":null,"key":null,"kind":"step","output":2,"status":"done"}],'
    '"parallel#1/y":[{"call_id":"parallel#1/y/add#1","due":null,"evidence":null,"key":null,'
    '"kind":"step","output":3,"status":"done"}],"race#1/only":[{"call_id":"race#1/only/add#1",'
    '"due":null,"evidence":null,"key":null,"kind":"step","output":4,"status":"done"}]},'
    '"branch_usage":{"parallel#1/x":{"claims":0,"cost":0.0,"elapsed_s":8.387699995182629e-05,'
    '"steps":1},"parallel#1/y":{"claims":0,"cost":0.0,"elapsed_s":5.2869000001010136e-05,'
    '"steps":1},"race#1/only":{"claims":0,"cost":0.0,"elapsed_s":4.698800012192805e-05,'
    '"steps":1}},"compensated":[],"compensating_for":null,"compensation_reason":null,'
    '"definition":{"fingerprint":"47df26f1d107d6dd","name":"legacy","version":1},'
    '"format_version":1,"journal":[{"call_id":"prepare#1","due":null,"evidence":null,"key":null,'
    '"kind":"step","output":2,"status":"done"},{"call_id":"pay#1","due":null,"evidence":"ran",'
    '"key":"legacy-1/pay#1","kind":"effect","output":{"paid":2},"status":"done"},'
    '{"call_id":"signal:go#1","due":1796159590.39802,"evidence":null,"key":null,"kind":"signal",'
    '"output":{"payload":{"ok":true},"sender":"ops","signal_id":"s1"},"status":"done"},'
    '{"call_id":"parallel#1","due":null,"evidence":null,"key":null,"kind":"parallel",'
    '"output":{"x":2,"y":3},"status":"done"},{"call_id":"race#1","due":null,"evidence":null,'
    '"key":null,"kind":"race","output":{"cancelled":[],"result":4,"superseded":[],'
    '"winner":"only"},"status":"done"},{"call_id":"timer#1","due":1796156290.83298,'
    '"evidence":null,"key":null,"kind":"timer","output":null,"status":"pending"}],'
    '"phase":"waiting","step_failures":{},"undo":[],"usage":{"claims":2,"cost":0.0,'
    '"elapsed_s":0.3566765860000487,"steps":5}}'
)

RAN: list[str] = []
legacy = Workflow("legacy", 1, signals=["go"])


@legacy.step()
def prepare(ctx: StepContext, n: int) -> int:
    RAN.append(ctx.call_id)
    return n + 1


@legacy.effect(idempotent=False)
def pay(ctx: StepContext, n: int) -> dict[str, int]:
    RAN.append(ctx.call_id)
    return {"paid": n}


@legacy.step()
def add(ctx: StepContext, n: int) -> int:
    RAN.append(ctx.call_id)
    return n + 1


@legacy.main
def main(ctx: WorkflowContext, n: int) -> dict[str, Any]:
    prepared = prepare(ctx, n)
    paid = pay(ctx, prepared)
    go = ctx.wait_for_signal("go", timeout=timedelta(hours=1))
    both = ctx.parallel({"x": lambda c: add(c, 1), "y": lambda c: add(c, 2)})
    winner, won = ctx.race({"only": lambda c: add(c, 3)})
    ctx.sleep(timedelta(minutes=5))
    return {"prepared": prepared, "paid": paid, "go": go, "both": both, "winner": winner, "won": won}


def _schema_6_with_tasks(backend: Backend, tasks: dict[str, tuple[str, str]]) -> None:
    """Build ``backend``'s database with the migrations up to version 6, as the previous
    release left it, holding ``tasks`` (task id -> (state, checkpoint text))."""
    with schema_at(backend, 6) as execute:
        for task_id, (state, text) in tasks.items():
            if backend.kind == "sqlite":
                now = "CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER)"
                execute(
                    "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, "
                    f"input, state, ready_at, created_at, updated_at, revision, checkpoint) VALUES (?, "
                    f"'legacy', 1, 'default', '1', ?, {now}, {now}, {now}, 3, ?)",
                    (task_id, state, text),
                )
            else:
                execute(
                    "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, "
                    "input, input_text, state, ready_at, created_at, updated_at, revision, checkpoint) "
                    "VALUES (%s, 'legacy', 1, 'default', '1'::jsonb, '1', %s, now(), now(), now(), 3, "
                    "%s::jsonb)",
                    (task_id, state, text),
                )


def test_migration_splits_a_legacy_checkpoint_into_rows_and_its_task_replays_to_the_end(
    backend: Backend,
) -> None:
    corrupt = '{"format_version": 1, "journal": "nonsense"}'
    _schema_6_with_tasks(
        backend,
        {
            "legacy-1": ("queued", LEGACY_TEXT),
            "legacy-done": ("terminal", LEGACY_TEXT),
            "torn": ("queued", corrupt),
        },
    )
    store = backend.open()  # migrates to the current version
    for task_id in ("legacy-1", "legacy-done"):
        checkpoint = read_checkpoint(store, task_id)
        assert checkpoint is not None
        assert [(e.kind, e.status) for e in checkpoint.journal] == [
            (EntryKind.STEP, EntryStatus.DONE),
            (EntryKind.EFFECT, EntryStatus.DONE),
            (EntryKind.SIGNAL, EntryStatus.DONE),
            (EntryKind.PARALLEL, EntryStatus.DONE),
            (EntryKind.RACE, EntryStatus.DONE),
            (EntryKind.TIMER, EntryStatus.PENDING),
        ]
        assert sorted(checkpoint.branch_journals) == ["parallel#1/x", "parallel#1/y", "race#1/only"]
        assert checkpoint.definition == WorkflowDefinition(legacy).identity  # the fingerprint held
        assert checkpoint.usage.steps == 5
    # A checkpoint whose journal is not one stays as it was, and fails closed when read.
    assert store.get_task("torn").checkpoint_json is not None
    assert store.read_journal("torn") == []
    with pytest.raises(CheckpointError, match="format version 1"):
        read_checkpoint(store, "torn")

    RAN.clear()
    store.set_clock_offset(timedelta(minutes=10))  # past the recorded timer, whenever this runs
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(legacy))
    lease = LeaseDuration(timedelta(seconds=30))
    worker = WorkflowWorker(store, registry, WorkerId.parse("w1"), lease, timedelta(seconds=10))
    try:
        outcomes = {}
        for _ in range(2):
            outcome = worker.run_once()
            outcomes[outcome.task_id] = outcome  # type: ignore[attr-defined]
    finally:
        worker.close()
    done = outcomes["legacy-1"]
    assert done.kind == "completed", done
    assert RAN == []
    assert done.result == {  # type: ignore[attr-defined]
        "prepared": 2,
        "paid": {"paid": 2},
        "go": {"ok": True},
        "both": {"x": 2, "y": 3},
        "winner": "only",
        "won": 4,
    }
    assert outcomes["torn"].kind == "failed"
    assert store.get_task("legacy-done").state is TaskState.TERMINAL
    assert isinstance(
        Checkpoint.decode("legacy-1", store.get_task("legacy-1").checkpoint_json or ""), Checkpoint
    )
