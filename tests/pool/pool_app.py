"""A supervisor process for the pool tests: ``python -m tests.pool.pool_app --url URL``.

Five-step workflows whose steps append ``<task> <call> <pid> <run id> <wall time>`` to a
ledger outside the store (the file named by ``POOL_LEDGER``); a step can be made slow
(``POOL_STEP_SECONDS``) so a test can signal processes or restart the database while
steps are running. ``pool-flow`` returns its input plus five; ``pool-traced`` does the
same, but each of its steps also returns the run id of the execution that produced it,
so the checkpoint tells which execution of a step was the committed one.

On exit (SIGTERM or SIGINT) the process prints the supervisor's report as one JSON line.
``POOL_CHILD_START_PAUSE_S`` holds each forked child that long inside ``os.fork()``,
before the worker code runs, having appended its pid to ``POOL_LEDGER`` + ``.forked``: a
test can signal a child there.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import uuid
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import IO, Any, NamedTuple

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowWorker,
    open_store,
)
from runifold_sync.model.cancellation import CancellationToken
from runifold_sync.pool.supervisor import WorkflowSupervisor, WorkflowSupervisorConfig
from tests.support import ledger, processes

STEPS = 5
pool_flow = Workflow("pool-flow", 1)
traced_flow = Workflow("pool-traced", 1)


class LedgerLine(NamedTuple):
    task_id: str
    call_id: str
    pid: int
    run_id: str
    at: float  # time.time() when the step body started


def read_ledger(path: Path) -> list[LedgerLine]:
    return [
        LedgerLine(task, call, int(pid), run, float(at)) for task, call, pid, run, at in ledger.read(path)
    ]


def _ledger(ctx: StepContext) -> str:
    """Record that this step body started; returns the id of this execution."""
    run_id = uuid.uuid4().hex[:12]
    at = f"{time.time():.6f}"
    ledger.append(os.environ["POOL_LEDGER"], ctx.task_id, ctx.call_id, os.getpid(), run_id, at, durable=False)
    return run_id


def _step_pause() -> None:
    time.sleep(float(os.environ.get("POOL_STEP_SECONDS", "0")))


@pool_flow.step()
def work(ctx: StepContext, value: int) -> int:
    _ledger(ctx)
    _step_pause()
    return value + 1


@pool_flow.main
def run(ctx: WorkflowContext, value: int) -> int:
    for _ in range(STEPS):
        value = work(ctx, value)
    return value


@traced_flow.step()
def traced_work(ctx: StepContext, value: int) -> dict[str, Any]:
    run_id = _ledger(ctx)
    _step_pause()
    return {"value": value + 1, "run": run_id}


@traced_flow.main
def run_traced(ctx: WorkflowContext, value: int) -> int:
    for _ in range(STEPS):
        value = traced_work(ctx, value)["value"]
    return value


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(pool_flow))
    reg.register(WorkflowDefinition(traced_flow))
    return reg


def _open(url: str, pool_timeout_s: float | None) -> WorkflowStore:
    if pool_timeout_s is None:
        return open_store(url)
    from runifold_sync.postgres import PostgresWorkflowStore

    return PostgresWorkflowStore.connect(url, pool_timeout=timedelta(seconds=pool_timeout_s))


def spawn(
    url: str,
    *,
    lease_s: float,
    grace_s: float,
    concurrency: int = 4,
    backoff_s: tuple[float, float] = (0.01, 0.1),
    pool_timeout_s: float | None = None,
    stderr: IO[str] | None = None,
    base_id: str = "pool",
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Start a supervisor process in its own session (``os.killpg`` ends all of it); its
    report is the one line on its stdout. Its workers are ``<base_id>-N``; ``env``
    replaces the environment (a clock shim's variables, say)."""
    options = [] if pool_timeout_s is None else ["--pool-timeout-s", str(pool_timeout_s)]
    return processes.spawn(
        "tests.pool.pool_app",
        "--url",
        url,
        "--concurrency",
        str(concurrency),
        "--lease-s",
        str(lease_s),
        "--grace-s",
        str(grace_s),
        "--min-backoff-s",
        str(backoff_s[0]),
        "--max-backoff-s",
        str(backoff_s[1]),
        "--base-id",
        base_id,
        *options,
        stderr=stderr,
        env=env,
        own_session=True,
    )


def _paused_start(pause_s: float) -> None:
    with open(os.environ["POOL_LEDGER"] + ".forked", "a") as forked:
        forked.write(f"{os.getpid()}\n")
    time.sleep(pause_s)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.pool.pool_app")
    parser.add_argument("--url", required=True, help="store URL: sqlite:///... or postgresql://...")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--lease-s", type=float, default=2.0)
    parser.add_argument("--grace-s", type=float, default=10.0)
    parser.add_argument("--min-backoff-s", type=float, default=0.01)
    parser.add_argument("--max-backoff-s", type=float, default=0.1)
    parser.add_argument("--pool-timeout-s", type=float, default=None, help="PostgreSQL pool_timeout")
    parser.add_argument("--base-id", default="pool", help="workers are BASE-0, BASE-1, ...")
    args = parser.parse_args()
    lease = LeaseDuration(timedelta(seconds=args.lease_s))
    if pause := os.environ.get("POOL_CHILD_START_PAUSE_S"):
        os.register_at_fork(after_in_child=lambda: _paused_start(float(pause)))

    def factory(worker_id: WorkerId) -> WorkflowWorker:
        return WorkflowWorker(
            _open(args.url, args.pool_timeout_s), registry(), worker_id, lease, lease.value / 4
        )

    config = (
        WorkflowSupervisorConfig(args.concurrency)
        .with_backoff(timedelta(seconds=args.min_backoff_s), timedelta(seconds=args.max_backoff_s))
        .with_shutdown_grace(timedelta(seconds=args.grace_s))
    )
    report = WorkflowSupervisor(factory, config, base_id=args.base_id).run(CancellationToken())
    summary = {"outcomes": report.outcomes, "per_worker": report.per_worker, "restarts": report.restarts}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
