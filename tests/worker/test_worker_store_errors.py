"""A store that goes away while the main function runs ends the cycle, not the task.

Found by ``tools/chaos.py --store postgres``: a PostgreSQL restart cut the connection
under a signal consumption, and the worker turned the ``StoreUnavailable`` raised
through ``ctx`` into "workflow main raised StoreUnavailable", failing the task for good
(and writing a checkpoint that recorded a signal consumption the store never committed).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
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
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import StoreUnavailable
from runifold_sync.outcomes import Completed
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState
from runifold_sync.store.records import Committed, Lease

LEASE = LeaseDuration(timedelta(seconds=10))
flow = Workflow("store-away", 1, signals=["go"])


@flow.step()
def add(ctx: StepContext, value: int) -> int:
    return value + 1


@flow.main
def main(ctx: WorkflowContext, value: int) -> dict[str, Any]:
    value = add(ctx, value)
    value = add(ctx, value)  # the first add's result is committed before this one runs
    received = ctx.wait_for_signal("go")
    return {"value": add(ctx, value), "signal": received}


class FlakyStore(SqliteWorkflowStore):
    """Raises ``StoreUnavailable`` once, on the first call of the method named ``fail``."""

    fail: str | None = None

    def _maybe_fail(self, method: str) -> None:
        if self.fail == method:
            self.fail = None
            raise StoreUnavailable(f"{method}: connection terminated (simulated server restart)")

    def commit_checkpoint(self, lease: Lease, revision: int, checkpoint_json: str, **kw: Any) -> Committed:
        self._maybe_fail("commit_checkpoint")
        return super().commit_checkpoint(lease, revision, checkpoint_json, **kw)

    def consume_signal(
        self, lease: Lease, revision: int, checkpoint_json: str, signal_id: str, **kw: Any
    ) -> Committed:
        self._maybe_fail("consume_signal")
        return super().consume_signal(lease, revision, checkpoint_json, signal_id, **kw)


@pytest.mark.parametrize("failing", ["commit_checkpoint", "consume_signal"])
def test_store_unavailable_under_ctx_ends_the_cycle_and_the_task_completes_later(
    tmp_path: Path, failing: str
) -> None:
    store = FlakyStore.open(tmp_path / "w.db")
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))
    worker = WorkflowWorker(store, registry, WorkerId.parse("w1"), LEASE, timedelta(seconds=2))
    try:
        task_id = store.enqueue(WorkflowTask.new("store-away", 1, 1, checkpoint_id="t")).task_id
        store.send_signal(task_id, "go", {"ok": True}, signal_id="s1", sender="test")
        store.fail = failing

        with pytest.raises(StoreUnavailable, match="simulated server restart"):
            worker.run_once()
        record = store.get_task(task_id)
        assert record.state is TaskState.LEASED and record.outcome is None
        assert [s.signal_id for s in store.pending_signals(task_id, "go")] == ["s1"]

        store.set_clock_offset(LEASE.value + timedelta(seconds=1))
        outcome = worker.run_once()
        assert isinstance(outcome, Completed), outcome
        assert outcome.result == {"value": 4, "signal": {"ok": True}}
        assert store.pending_signals(task_id, "go") == []
    finally:
        worker.close()
        store.close()
