"""The heartbeat thread keeps the lease of the task in flight alive through a step that
runs longer than the lease, so no other worker can claim it meanwhile; real time, since
what is tested is the thread beside a blocking step."""

from __future__ import annotations

import threading
import time
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
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.outcomes import Completed
from tests.support.backends import Backend

LEASE = LeaseDuration(timedelta(seconds=1))
STEP_S = 3.5  # more than three leases


@pytest.mark.timeout(60)
def test_a_step_longer_than_the_lease_keeps_its_task_claimed_by_heartbeats(backend: Backend) -> None:
    workflow = Workflow("long-step", 1)

    @workflow.step()
    def crunch(ctx: StepContext, _input: None) -> str:
        time.sleep(STEP_S)
        return "crunched"

    @workflow.main
    def main(ctx: WorkflowContext, _input: None) -> str:
        return crunch(ctx, None)

    store, rival = backend.open(), backend.open()
    store.enqueue(WorkflowTask.new("long-step", 1, None, checkpoint_id="long"))
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(workflow))
    worker = WorkflowWorker(store, registry, WorkerId.parse("owner"), LEASE, timedelta(milliseconds=300))

    rival_claims: list[int] = []
    done = threading.Event()

    def claim_meanwhile() -> None:
        while not done.wait(0.2):
            rival_claims.append(len(rival.claim(WorkerId.parse("rival"), LEASE, limit=1)))

    thread = threading.Thread(target=claim_meanwhile, name="rival-claimer")
    thread.start()
    try:
        outcome = worker.run_once()
    finally:
        done.set()
        thread.join()
        worker.close()

    assert outcome == Completed("long", "crunched")
    assert len(rival_claims) >= 10 and set(rival_claims) == {0}  # tried all along, never got it
    kinds = [event.kind for event in store.history("long")]
    assert kinds.count("claimed") == 1 and kinds[-1] == "completed"
    assert store.get_task("long").fencing_token == 1
