"""A supervisor pool with a poison workflow among healthy ones, for the poison pool test:

    python -m tests.pool.poison_app --url URL --ledger PATH --concurrency P --lease-s X

``poison``'s only step SIGKILLs the child process running it, every time; its budget
allows ``POISON_MAX_ATTEMPTS`` claims without progress. ``healthy`` runs
``HEALTHY_STEPS`` short steps and returns its input plus that many. Every step body first
appends ``"<step> <task id> <pid>"`` to the ledger (``O_APPEND``, fsynced), so the test
counts outside the process what really ran. On SIGTERM the process prints the
supervisor's report as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
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
from tests.support import ledger, processes

POISON_MAX_ATTEMPTS = 3
HEALTHY_STEPS = 3
HEALTHY_STEP_S = 0.05  # so the healthy work spans the poison's crash loop

poison = Workflow("poison", 1)
healthy = Workflow("healthy", 1)


def _record(step: str, ctx: StepContext) -> None:
    ledger.append(os.environ["POISON_LEDGER"], step, ctx.task_id, os.getpid())


@poison.step()
def explode(ctx: StepContext, n: int) -> int:
    _record("explode", ctx)
    os.kill(os.getpid(), signal.SIGKILL)
    return n  # never reached


@poison.main
def poison_main(ctx: WorkflowContext, n: int) -> int:
    return explode(ctx, n)


@healthy.step()
def work(ctx: StepContext, n: int) -> int:
    _record("work", ctx)
    time.sleep(HEALTHY_STEP_S)
    return n + 1


@healthy.main
def healthy_main(ctx: WorkflowContext, n: int) -> int:
    for _ in range(HEALTHY_STEPS):
        n = work(ctx, n)
    return n


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(poison, Budget(max_attempts=POISON_MAX_ATTEMPTS)))
    reg.register(WorkflowDefinition(healthy))
    return reg


def spawn(url: str, ledger_path: Path, *, concurrency: int, lease_s: float) -> subprocess.Popen[str]:
    """Start the pool in its own session (``processes.kill`` ends all of it)."""
    return processes.spawn(
        "tests.pool.poison_app",
        "--url",
        url,
        "--ledger",
        str(ledger_path),
        "--concurrency",
        str(concurrency),
        "--lease-s",
        str(lease_s),
        own_session=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.pool.poison_app")
    parser.add_argument("--url", required=True, help="store URL: sqlite:///... or postgresql://...")
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--lease-s", type=float, required=True)
    args = parser.parse_args()
    os.environ["POISON_LEDGER"] = args.ledger
    lease = LeaseDuration(timedelta(seconds=args.lease_s))

    def factory(worker_id: WorkerId) -> WorkflowWorker:  # runs in the child, after the fork
        return WorkflowWorker(open_store(args.url), registry(), worker_id, lease, lease.value / 4)

    config = WorkflowSupervisorConfig(args.concurrency).with_backoff(
        timedelta(milliseconds=10), timedelta(milliseconds=100)
    )
    report = WorkflowSupervisor(factory, config, base_id="poison-pool").run(CancellationToken())
    print(json.dumps({"outcomes": report.outcomes, "restarts": report.restarts}), flush=True)


if __name__ == "__main__":
    main()
