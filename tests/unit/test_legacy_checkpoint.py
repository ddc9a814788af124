"""A checkpoint written by the engine before the replay split (399b8a8) still replays.

The text below is what that code stored for this workflow while it waited on its timer,
after a step, an effect, a signal, a parallel call and a race: format version 1, every
journal entry kind but the effect intent (``test_checkpoint.py`` has that one). It must
decode and re-encode byte for byte, keep its fingerprint, and finish without running any
recorded call again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

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
from runifold_sync.checkpoint import Checkpoint, EntryKind, EntryStatus

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


def test_a_legacy_checkpoint_decodes_to_typed_entries_and_encodes_byte_for_byte() -> None:
    checkpoint = Checkpoint.decode("legacy-1", LEGACY_TEXT)
    assert [(e.kind, e.status) for e in checkpoint.journal] == [
        (EntryKind.STEP, EntryStatus.DONE),
        (EntryKind.EFFECT, EntryStatus.DONE),
        (EntryKind.SIGNAL, EntryStatus.DONE),
        (EntryKind.PARALLEL, EntryStatus.DONE),
        (EntryKind.RACE, EntryStatus.DONE),
        (EntryKind.TIMER, EntryStatus.PENDING),
    ]
    assert checkpoint.encode("legacy-1", 1 << 20) == LEGACY_TEXT
    assert checkpoint.definition == WorkflowDefinition(legacy).identity  # the fingerprint held


def test_a_legacy_checkpoint_replays_to_the_end_without_running_a_recorded_call(store: WorkflowStore) -> None:
    RAN.clear()
    store.enqueue(WorkflowTask.new("legacy", 1, 1, checkpoint_id="legacy-1"))
    lease = LeaseDuration(timedelta(seconds=30))
    (claimed,) = store.claim(WorkerId.parse("w0"), lease)
    store.commit_checkpoint(claimed.lease, claimed.revision, LEGACY_TEXT)
    store.release(claimed.lease, delay=timedelta(0), reason="written by the old engine")
    store.set_clock_offset(timedelta(minutes=10))  # past the recorded timer, whenever this runs
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(legacy))
    worker = WorkflowWorker(store, registry, WorkerId.parse("w1"), lease, timedelta(seconds=10))
    try:
        outcome = worker.run_once()
    finally:
        worker.close()
    assert outcome.kind == "completed", outcome
    assert RAN == []
    assert outcome.result == {  # type: ignore[attr-defined]
        "prepared": 2,
        "paid": {"paid": 2},
        "go": {"ok": True},
        "both": {"x": 2, "y": 3},
        "winner": "only",
        "won": 4,
    }
