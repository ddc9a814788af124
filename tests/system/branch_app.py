"""A worker process for the parallel-branch crash test:
``python -m tests.system.branch_app --database URL --worker-id ID --ledger PATH``.

Branch "quick" finishes its two steps at once; branch "slow" blocks in its second step
until a release file appears, so the test can SIGKILL the process there.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta
from pathlib import Path

from runifold_sync import (
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
from tests.support import ledger

branching = Workflow("branching", 1)


def _ledger(ctx: StepContext) -> None:
    ledger.append(os.environ["BRANCH_LEDGER"], ctx.call_id, os.getpid())


@branching.step()
def quick(ctx: StepContext, value: int) -> int:
    _ledger(ctx)
    return value + 1


@branching.step()
def slow(ctx: StepContext, value: int) -> int:
    _ledger(ctx)
    release = Path(os.environ["BRANCH_LEDGER"] + ".release")
    if ctx.call_id.endswith("#2"):
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return value + 10


def quick_branch(bctx: WorkflowContext) -> int:
    return quick(bctx, quick(bctx, 0))


def slow_branch(bctx: WorkflowContext) -> int:
    return slow(bctx, slow(bctx, 0))


@branching.main
def main(ctx: WorkflowContext, _input: None) -> dict[str, int]:
    return ctx.parallel({"quick": quick_branch, "slow": slow_branch})


def run() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True, help="store URL (sqlite:/// or postgresql://)")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--ledger", required=True)
    args = parser.parse_args()
    os.environ["BRANCH_LEDGER"] = args.ledger
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(branching))
    store = open_store(args.database)
    lease = LeaseDuration(timedelta(seconds=1.5))
    worker = WorkflowWorker(store, registry, WorkerId.parse(args.worker_id), lease, timedelta(seconds=0.5))
    outcome = worker.run_once()
    print(json.dumps({"outcome": outcome.kind}), flush=True)
    worker.close()


if __name__ == "__main__":
    run()
