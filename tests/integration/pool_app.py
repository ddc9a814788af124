"""A supervisor process for the pool tests: ``python -m tests.integration.pool_app``.

Five-step workflows whose steps append ``<task> <call> <pid>`` to a ledger outside the
store; a step can be made slow so a test can signal processes while steps are running.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta

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
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.supervisor import CancellationToken, WorkflowSupervisor, WorkflowSupervisorConfig

STEPS = 5
pool_flow = Workflow("pool-flow", 1)


def _ledger(ctx: StepContext) -> None:
    fd = os.open(os.environ["POOL_LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.task_id} {ctx.call_id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@pool_flow.step()
def work(ctx: StepContext, value: int) -> int:
    _ledger(ctx)
    time.sleep(float(os.environ.get("POOL_STEP_SECONDS", "0")))
    return value + 1


@pool_flow.main
def run(ctx: WorkflowContext, value: int) -> int:
    for _ in range(STEPS):
        value = work(ctx, value)
    return value


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(pool_flow))
    return reg


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--grace-s", type=float, default=10.0)
    args = parser.parse_args()
    lease = LeaseDuration(timedelta(seconds=args.lease_s))

    def factory(worker_id: WorkerId) -> WorkflowWorker:
        store = SqliteWorkflowStore.open(args.db)
        return WorkflowWorker(store, registry(), worker_id, lease, lease.value / 4)

    config = (
        WorkflowSupervisorConfig(args.concurrency)
        .with_backoff(timedelta(milliseconds=10), timedelta(milliseconds=100))
        .with_shutdown_grace(timedelta(seconds=args.grace_s))
    )
    report = WorkflowSupervisor(factory, config, base_id="pool").run(CancellationToken())
    print(json.dumps({"outcomes": report.outcomes, "restarts": report.restarts}), flush=True)


if __name__ == "__main__":
    main()
