"""A long workflow of short steps, each with a compensation, and a one-shot worker
process that runs it.

    python -m tests.system.cancel_app --database URL --worker-id ID

The process opens its own store, runs ``run_once()`` once and prints the outcome as one
JSON line on stdout. Its heartbeat interval (a minute) is longer than the whole task, so
a cancel can only reach it through its step-boundary commits.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import timedelta

from runifold_sync import (
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)

from .one_cycle import run_one_cycle

STEPS = 400
STEP_S = 0.05

batch = Workflow("batch", 1)


@batch.step()
def process(ctx: StepContext, item: int) -> int:
    time.sleep(STEP_S)
    return item


@batch.compensate_for("process")
def unprocess(ctx: StepContext, item: int) -> None:
    """Nothing external to undo here: the checkpoint's ``compensated`` list shows it ran."""


@batch.main
def batch_main(ctx: WorkflowContext, items: int) -> int:
    return sum(process(ctx, item) for item in range(items))


registry = WorkflowRegistry()
registry.register(WorkflowDefinition(batch))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database", required=True, help="store URL")
    parser.add_argument("--worker-id", required=True)
    args = parser.parse_args(argv)

    return run_one_cycle(args.database, registry, args.worker_id, timedelta(minutes=2), timedelta(minutes=1))


if __name__ == "__main__":
    sys.exit(main())
