"""A worker process for the heartbeat starvation test:
``python -m tests.worker.starve_app --url URL --worker-id ID --ledger PATH
[--hold-gil-fd FD] [--hold-until PATH] [--until-completed-s S]``
(URL: ``sqlite:///...`` or ``postgresql://...``). Logs go to stderr as JSON lines.

The first owner's ``hog`` step (``--hold-gil-fd``) blocks in a C ``read`` of the pipe
``FD`` through ``ctypes.PyDLL``, which never releases the GIL, so its heartbeat thread
cannot run until the test writes a byte: the lease lapses while the worker is still
inside its step, for exactly as long as the test decides. It then sleeps (the GIL free)
for a few heartbeat intervals, in which the heartbeat thread sends the starved lease's
extension. A later owner's ``hog`` step (``--hold-until``) waits, heartbeating, until the
file ``PATH`` exists, so it holds the task while the starved worker wakes.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import sys
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
from runifold_sync.engine.logs import JsonFormatter
from runifold_sync.outcomes import Completed, LeaseLost
from tests.support import ledger

LEASE = LeaseDuration(timedelta(seconds=1))
HEARTBEAT = timedelta(seconds=0.25)
AFTER_STARVING_S = 1.0  # four heartbeat intervals with the GIL free
HOLD_LIMIT_S = 60.0  # a hold nobody releases ends, so no orphan waits forever

starving = Workflow("starving", 1)
_gil_fd: int | None = None
_hold_until: str | None = None


def hold_the_gil_until_written(fd: int) -> None:
    """Block in C ``read(fd)`` with the GIL held: ``PyDLL`` calls keep it."""
    libc = ctypes.PyDLL(None)
    libc.read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    libc.read.restype = ctypes.c_ssize_t
    buffer = ctypes.create_string_buffer(1)
    if libc.read(fd, buffer, 1) != 1:
        raise OSError(f"read of fd {fd} did not return the byte the test writes")


def _ledger(ctx: StepContext) -> None:
    ledger.append(os.environ["STARVE_LEDGER"], ctx.call_id, os.getpid(), ctx.fence, durable=False)


@starving.step()
def hog(ctx: StepContext) -> str:
    _ledger(ctx)
    if _gil_fd is not None:
        hold_the_gil_until_written(_gil_fd)
        time.sleep(AFTER_STARVING_S)
    elif _hold_until is not None:
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not Path(_hold_until).exists() and time.monotonic() < deadline:
            time.sleep(0.02)
    return "hogged"


@starving.step()
def after(ctx: StepContext) -> str:
    _ledger(ctx)
    return "after"


@starving.main
def main(ctx: WorkflowContext, _input: None) -> list[str]:
    return [hog(ctx), after(ctx)]


def run() -> None:
    global _gil_fd, _hold_until
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--hold-gil-fd", type=int, default=None)
    parser.add_argument("--hold-until", default=None)
    parser.add_argument("--until-completed-s", type=float, default=0.0)
    args = parser.parse_args()
    _gil_fd, _hold_until = args.hold_gil_fd, args.hold_until
    os.environ["STARVE_LEDGER"] = args.ledger
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(starving))
    store = open_store(args.url)
    worker = WorkflowWorker(store, registry, WorkerId.parse(args.worker_id), LEASE, HEARTBEAT)
    deadline = time.monotonic() + args.until_completed_s
    outcome = worker.run_once()
    while not isinstance(outcome, Completed) and time.monotonic() < deadline:
        time.sleep(0.05)
        outcome = worker.run_once()
    token = outcome.fencing_token if isinstance(outcome, LeaseLost) else None
    print(json.dumps({"outcome": outcome.kind, "fencing_token": token}), flush=True)
    worker.close()
    store.close()


if __name__ == "__main__":
    run()
