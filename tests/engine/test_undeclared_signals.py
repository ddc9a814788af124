"""Signal names a definition does not declare, on SQLite and PostgreSQL.

Until a registry has told the store the task's definition (the task was enqueued with
``WorkflowTask.new`` and no worker serving it has started), the store keeps a signal of
any name, so until the workflow's next wait an undeclared one is pending and counts toward
the task's cap. That wait refuses it, records the refusal in the history and takes it out
of the pending signals; signals of other declared names stay for their own waits. (Once
the store knows the names it refuses a misspelt one where it is sent:
``tests/store/test_signal_checks.py``.)
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from runifold_sync import (
    LeaseDuration,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)
from runifold_sync.errors import SignalRefused
from runifold_sync.outcomes import Completed, Suspended
from tests.support.backends import Backend

pytestmark = pytest.mark.timeout(120)


def _waits_for_go() -> Workflow:
    wf = Workflow("go-flow", 1, signals=["go", "later"])

    @wf.main
    def main(ctx: WorkflowContext, _input: None) -> object:
        return ctx.wait_for_signal("go")

    return wf


def test_a_wait_refuses_undeclared_signal_names_and_frees_their_place_under_the_cap(
    backend: Backend,
) -> None:
    store = open_store(backend.url, max_pending_signals=2)
    backend.opened.append(store)
    store.enqueue(WorkflowTask.new("go-flow", 1, None, checkpoint_id="t1"))

    def send(name: str, signal_id: str) -> bool:
        return store.send_signal("t1", name, {"n": signal_id}, signal_id=signal_id, sender="ops").created

    assert send("gogo", "s1") and send("later", "s2")
    with pytest.raises(SignalRefused, match="limit 2"):  # the misspelt name takes a place
        send("go", "s3")
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(_waits_for_go()))
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(minutes=5)), timedelta(minutes=1)
    )
    try:
        assert isinstance(worker.run_once(), Suspended)  # the wait refused "gogo"
        assert [s.signal_id for s in store.pending_signals("t1")] == ["s2"]
        assert send("go", "s3")  # its place is free again
        assert worker.run_once() == Completed("t1", {"n": "s3"})
    finally:
        worker.close()

    refusals = [e.detail for e in store.history("t1") if e.kind == "signal_refused"]
    assert [(d["signal_id"], d.get("note") or d.get("refused")) for d in refusals] == [
        ("s3", "the task already has 2 pending signals (limit 2)"),
        ("s1", "signal 'gogo' is not declared by Workflow('go-flow', version=1)"),
    ]
    # The declared name nobody waited for yet is left for its own wait.
    assert [(s.signal_id, s.name) for s in store.pending_signals("t1")] == [("s2", "later")]
