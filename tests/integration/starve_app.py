"""A worker process whose first step holds the GIL (a catastrophic regex inside the C
regex engine) for longer than its lease, so its heartbeat thread cannot run:
``python -m tests.integration.starve_app --url URL --worker-id ID --ledger PATH --hog-n N``
(URL: ``sqlite:///...`` or ``postgresql://...``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from datetime import timedelta
from pathlib import Path

from runifold_sync import (
    Completed,
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

starving = Workflow("starving", 1)
HOG_N = 0


def hold_the_gil(n: int) -> None:
    """Exponential backtracking inside re's C code, which never releases the GIL."""
    re.match(r"(a+)+$", "a" * n + "b")


def _ledger(ctx: StepContext) -> None:
    with open(os.environ["STARVE_LEDGER"], "a") as ledger:
        ledger.write(f"{ctx.call_id} {os.getpid()} {ctx.fence}\n")


@starving.step()
def hog(ctx: StepContext) -> str:
    _ledger(ctx)
    marker = Path(os.environ["STARVE_LEDGER"] + ".hogged")
    if not marker.exists():  # only the first owner starves
        marker.touch()
        hold_the_gil(HOG_N)
    return "hogged"


@starving.step()
def after(ctx: StepContext) -> str:
    _ledger(ctx)
    return "after"


@starving.main
def main(ctx: WorkflowContext, _input: None) -> list[str]:
    return [hog(ctx), after(ctx)]


def run() -> None:
    global HOG_N
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--hog-n", type=int, default=0)
    parser.add_argument("--until-completed-s", type=float, default=0.0)
    args = parser.parse_args()
    HOG_N = args.hog_n
    os.environ["STARVE_LEDGER"] = args.ledger
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(starving))
    store = open_store(args.url)
    lease = LeaseDuration(timedelta(seconds=1))
    worker = WorkflowWorker(store, registry, WorkerId.parse(args.worker_id), lease, timedelta(seconds=0.25))
    deadline = time.monotonic() + args.until_completed_s
    outcome = worker.run_once()
    while not isinstance(outcome, Completed) and time.monotonic() < deadline:
        time.sleep(0.05)
        outcome = worker.run_once()
    print(json.dumps({"outcome": outcome.kind}), flush=True)
    worker.close()
    store.close()


if __name__ == "__main__":
    run()
