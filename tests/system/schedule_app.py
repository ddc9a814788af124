"""The scheduled workflow of the schedule tests, and a worker process that runs it.

``registry`` is what the pool tests run (``python -m runifold_sync run --app
tests.system.schedule_app:registry``): schedule ``every-second`` (``every=1s``) and
schedule ``hourly`` (``every=1h``, due only when a test moves the store clock), both of
workflow ``ticked``, whose one step appends ``<schedule> <tick> <task> <pid>`` to the
ledger named by ``SCHEDULE_LEDGER`` (when set), so a test counts the runs of each tick.

    RUNIFOLD_CRASH_AT=before_tick:hourly python -m tests.system.schedule_app --url URL

runs a worker (and so its schedule thread) until it is killed at the armed crash point,
or for ``--seconds`` at most.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from datetime import timedelta

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    Schedule,
    ScheduleTick,
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

LEDGER_ENV = "SCHEDULE_LEDGER"
ticked = Workflow("ticked", 1)


@ticked.step()
def record(ctx: StepContext, run: ScheduleTick) -> str:
    path = os.environ.get(LEDGER_ENV)
    if path:
        ledger.append(path, run.schedule, run.tick.isoformat(), ctx.task_id, os.getpid(), durable=False)
    return run.tick.isoformat()


@ticked.main
def ticked_main(ctx: WorkflowContext, run: ScheduleTick) -> str:
    return record(ctx, run)


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(ticked))
    reg.add_schedule(Schedule("every-second", "ticked", 1, every=timedelta(seconds=1)))
    reg.add_schedule(Schedule("hourly", "ticked", 1, every=timedelta(hours=1), input={"report": "usage"}))
    return reg


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system.schedule_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    store = open_store(args.url)
    worker = WorkflowWorker(
        store,
        registry(),
        WorkerId.parse(f"scheduler-{os.getpid()}"),
        LeaseDuration(timedelta(seconds=2)),
        timedelta(seconds=0.5),
    )
    token = CancellationToken()
    threading.Timer(args.seconds, token.cancel).start()
    try:
        worker.run(token)
    finally:
        worker.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
