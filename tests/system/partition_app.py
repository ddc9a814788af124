"""A supervised pool for the partition tests, run inside a network namespace:
``python -m tests.system.partition_app --url URL``.

``partition-flow`` runs ``STEPS`` steps that each sleep ``PARTITION_STEP_S`` seconds;
``partition-charge`` prepares, then runs a non-idempotent effect with no reconcile
(``charge``) whose body waits until the file named by ``PARTITION_GATE`` exists, then
finishes. Every step and effect body appends ``<task> <call> <worker pid> <time>`` to
the ledger named by ``PARTITION_LEDGER``, outside the store, so a test counts what ran.
Each definition allows ``--max-attempts`` claims without progress.

On SIGTERM the process prints the supervisor's report as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

from runifold_sync import (
    Budget,
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
    open_store,
)
from runifold_sync.model.cancellation import CancellationToken
from runifold_sync.pool.supervisor import WorkflowSupervisor, WorkflowSupervisorConfig
from tests.support import ledger

STEPS = 4
GATE_WAIT_S = 120.0
flow = Workflow("partition-flow", 1)
charging = Workflow("partition-charge", 1)


def _record(ctx: StepContext) -> None:
    ledger.append(os.environ["PARTITION_LEDGER"], ctx.task_id, ctx.call_id, os.getpid(), f"{time.time():.6f}")


@flow.step()
def work(ctx: StepContext, value: int) -> int:
    _record(ctx)
    time.sleep(float(os.environ.get("PARTITION_STEP_S", "0")))
    return value + 1


@flow.main
def run(ctx: WorkflowContext, value: int) -> int:
    for _ in range(STEPS):
        value = work(ctx, value)
    return value


@charging.step()
def prepare(ctx: StepContext, order: str) -> str:
    _record(ctx)
    return f"prepared {order}"


@charging.effect(idempotent=False)
def charge(ctx: StepContext, prepared: str) -> str:
    _record(ctx)
    gate = Path(os.environ["PARTITION_GATE"])
    deadline = time.monotonic() + GATE_WAIT_S
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return f"charged {ctx.idempotency_key}"


@charging.step()
def finish(ctx: StepContext, receipt: str) -> str:
    _record(ctx)
    return receipt


@charging.main
def run_charge(ctx: WorkflowContext, order: str) -> str:
    return finish(ctx, charge(ctx, prepare(ctx, order)))


def registry(max_attempts: int) -> WorkflowRegistry:
    reg = WorkflowRegistry()
    budget = Budget(max_attempts=max_attempts)
    reg.register(WorkflowDefinition(flow, budget=budget))
    reg.register(WorkflowDefinition(charging, budget=budget))
    return reg


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.system.partition_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--lease-s", type=float, required=True)
    parser.add_argument("--heartbeat-s", type=float, required=True)
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--base-id", default="cut")
    args = parser.parse_args()
    lease = LeaseDuration(timedelta(seconds=args.lease_s))

    def factory(worker_id: WorkerId) -> WorkflowWorker:
        return WorkflowWorker(
            open_store(args.url),
            registry(args.max_attempts),
            worker_id,
            lease,
            timedelta(seconds=args.heartbeat_s),
        )

    config = WorkflowSupervisorConfig(args.concurrency).with_backoff(
        timedelta(milliseconds=10), timedelta(milliseconds=200)
    )
    report = WorkflowSupervisor(factory, config, base_id=args.base_id).run(CancellationToken())
    print(json.dumps({"outcomes": report.outcomes, "restarts": report.restarts}), flush=True)


if __name__ == "__main__":
    main()
