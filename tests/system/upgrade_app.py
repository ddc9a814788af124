"""A three-step workflow and a one-cycle worker, run by this release or by the previous
one (``PYTHONPATH`` names the exported package of the previous release first), for
``test_upgrade_with_old_workers.py``. It uses only API both releases have.

    python -m tests.system.upgrade_app --url URL --ledger PATH --gate PATH --worker-id ID

The second step's body appends its line to the ledger and then waits until the gate
file exists, so the test can migrate the schema while this worker is inside it. The
process enqueues the task (``u1``, idempotent), runs one cycle and prints how it ended,
then tries one more claim and prints how that ended.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import runifold_sync
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
    open_store,
)

LEASE = LeaseDuration(timedelta(seconds=2))
GATE_TIMEOUT_S = 60.0
flow = Workflow("upgrade", 1)


@flow.step()
def work(ctx: StepContext, n: int) -> int:
    with open(os.environ["UPGRADE_LEDGER"], "a") as ledger:
        ledger.write(f"{ctx.call_id} {os.getpid()}\n")
    gate = Path(os.environ["UPGRADE_GATE"])
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while n == 2 and not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return n


@flow.main
def main(ctx: WorkflowContext, steps: int) -> int:
    return sum(work(ctx, n) for n in range(1, steps + 1))


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(flow))
    return reg


def run() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.system.upgrade_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args()
    print(f"package: {os.path.dirname(runifold_sync.__file__)}", flush=True)
    store = open_store(args.url)
    store.enqueue(WorkflowTask.new("upgrade", 1, 3, checkpoint_id="u1"))
    worker = WorkflowWorker(store, registry(), WorkerId.parse(args.worker_id), LEASE, timedelta(seconds=0.5))
    try:
        print(f"cycle ended: {worker.run_once()!r}", flush=True)
    except Exception as exc:
        print(f"cycle raised {type(exc).__name__}: {exc}", flush=True)
    try:  # something claimable: the claim must lease it (or fail)
        store.enqueue(WorkflowTask.new("upgrade", 1, 3, checkpoint_id="u2"))
        print(f"claim answered: {store.claim(WorkerId.parse(args.worker_id), LEASE)!r}", flush=True)
    except Exception as exc:
        print(f"claim raised {type(exc).__name__}: {exc}", flush=True)
    worker.close()


if __name__ == "__main__":
    run()
