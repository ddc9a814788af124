"""A worker process whose loop holds its completions for a claim batch's one commit
(``batch.py``), for the crash points of that commit.

    RUNIFOLD_CRASH_AT=point[:subject] python -m tests.system.held_app --url URL --ledger PATH

``one`` is a workflow of one step, which appends ``one <task> <pid>`` to the ledger (and,
for the task named by ``--slow``, then sleeps ``SLOW_S``, past a few heartbeats, so the
heartbeat thread commits the completions held before it). The process runs
``WorkflowWorker.run`` with a claim batch of ``BATCH`` until every task named by
``--task`` has ended; with a crash point armed it is expected to die of SIGKILL on the
way.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta

from runifold_sync import (
    CancellationToken,
    StepContext,
    WorkerId,
    WorkerSettings,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
    open_store,
)
from runifold_sync.outcomes import RunOutcome
from runifold_sync.store import TaskState
from tests.support import ledger

from .crash_app import HEARTBEAT, LEASE, LEDGER_ENV

BATCH = 3
SLOW_ENV = "HELD_SLOW_TASK"
SLOW_S = HEARTBEAT.total_seconds() * 5
flow = Workflow("one", 1)


@flow.step()
def only(ctx: StepContext, n: int) -> int:
    ledger.append(os.environ[LEDGER_ENV], "one", ctx.task_id, os.getpid())
    if os.environ.get(SLOW_ENV) == ctx.task_id:
        time.sleep(SLOW_S)
    return n + 1


@flow.main
def main(ctx: WorkflowContext, n: int) -> int:
    return only(ctx, n)


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(flow))
    return reg


def main_() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system.held_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--task", action="append", required=True)
    parser.add_argument("--slow")
    args = parser.parse_args()
    os.environ[LEDGER_ENV] = args.ledger
    if args.slow:
        os.environ[SLOW_ENV] = args.slow
    store = open_store(args.url)
    # Without --slow the batch's one commit must be the loop's, after the third body: a
    # beat inside the batch would commit the completions held so far on its own (a loaded
    # CI machine took over 0.1 s for three one-line bodies). The longest heartbeat the
    # lease allows keeps the beats out of it; --slow wants them, at the usual pace.
    heartbeat = HEARTBEAT if args.slow else LEASE.value / 2
    settings = WorkerSettings(LEASE, heartbeat, claim_batch=BATCH)
    worker = WorkflowWorker(store, registry(), WorkerId.parse(f"held-{os.getpid()}"), settings=settings)
    token = CancellationToken()

    def stop_when_done(outcome: RunOutcome) -> None:
        print(outcome.kind, flush=True)
        if all(store.get_task(t).state is TaskState.TERMINAL for t in args.task):
            token.cancel()

    try:
        worker.run(token, on_outcome=stop_when_done, max_backoff=timedelta(milliseconds=100))
    finally:
        worker.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main_())
