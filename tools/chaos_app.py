"""The workflow and the supervisor process of the chaos run (see ``tools/chaos.py``).

    python tools/chaos_app.py --url URL --workdir DIR --processes P --lease-s L --heartbeat-s H

``chaos-flow`` runs K calls chosen by its input: plain steps, one idempotent effect
(``notify``), one non-idempotent effect (``charge``) whose ``reconcile`` reads the ledger,
from four calls on one child workflow (``chaos-child``, one step, in tenant
``chaos-children``) that it starts and waits for, a short durable timer and a wait for
the signal ``go`` that the chaos tool sends.

Every body appends ``<task> <call id> <pid> <fencing token> <run id> <kind> <value> <time>``
to ``ledger.txt`` in the work directory (``O_APPEND``, fsynced), so the check sees what
really ran, outside the store. The ledger stands for an external system that honours
``ctx.fence`` (DESIGN section 6): a per-task fence file, locked with ``flock`` around each
append, keeps the highest token seen, and a body whose token is below it is refused
(the line goes to ``refused.txt`` and the body raises :class:`FencedOut`). A reconcile
first raises the fence to its own token, then reads the ledger, so an old owner that is
still running cannot charge after the new owner decided the charge did not happen.

The supervisor's children register ``<pid> <worker id>`` in ``workers.txt`` when they
start, which is how the chaos tool knows whom it kills. On SIGTERM the process prints the
supervisor's report as one JSON line.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from runifold_sync import (
    Budget,
    CapabilitySet,
    EffectEvidence,
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

FLOW = "chaos-flow"
CHILD_FLOW = "chaos-child"
CHILD_TENANT = "chaos-children"  # so the tool counts the parents' progress apart
SIGNAL = "go"
# A chaos run kills the same task several times on purpose; the poison-task limit must
# not mistake that for a step that crashes its worker every time.
MAX_ATTEMPTS = 25
WORKDIR_ENV = "CHAOS_WORKDIR"
STEP_MS_ENV = "CHAOS_STEP_MS"

T = TypeVar("T")


class FencedOut(RuntimeError):
    """A body ran under a fencing token lower than one the ledger has already seen."""


class LedgerLine(NamedTuple):
    task_id: str
    call_id: str
    pid: int
    token: int
    run_id: str
    kind: str
    value: int
    at: float  # time.time() when the line was written


def parse_ledger(path: Path) -> list[LedgerLine]:
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        task, call, pid, token, run, kind, value, at = text.split()
        lines.append(LedgerLine(task, call, int(pid), int(token), run, kind, int(value), float(at)))
    return lines


def _workdir() -> Path:
    return Path(os.environ[WORKDIR_ENV])


def _append(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _under_fence(task_id: str, token: int, action: Callable[[bool], T]) -> T:
    """Run ``action(accepted)`` holding the task's fence lock, after raising the fence
    to ``token``; ``accepted`` is False when a higher token was seen before."""
    fences = _workdir() / "fences"
    fences.mkdir(exist_ok=True)
    fd = os.open(fences / task_id, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        raw = os.pread(fd, 32, 0).strip()
        highest = int(raw) if raw else 0
        if token > highest:
            os.pwrite(fd, f"{token:020d}".encode(), 0)
        return action(token >= highest)
    finally:
        os.close(fd)  # releases the lock, also when the process dies holding it


def _record(ctx: StepContext, kind: str, value: int) -> dict[str, Any]:
    """The body of every step and effect: one fenced ledger line, then some work."""
    run_id = uuid.uuid4().hex[:12]
    fields = (ctx.task_id, ctx.call_id, os.getpid(), ctx.fence, run_id, kind, value, f"{time.time():.6f}")
    line = " ".join(map(str, fields)) + "\n"

    def write(accepted: bool) -> bool:
        _append(_workdir() / ("ledger.txt" if accepted else "refused.txt"), line)
        return accepted

    if not _under_fence(ctx.task_id, ctx.fence, write):
        raise FencedOut(f"{ctx.task_id} {ctx.call_id}: token {ctx.fence} is stale")
    time.sleep(float(os.environ.get(STEP_MS_ENV, "0")) / 1000)
    return {"value": value, "run": run_id, "token": ctx.fence}


flow = Workflow(FLOW, 1, signals=[SIGNAL])


@flow.step()
def work(ctx: StepContext, value: int) -> dict[str, Any]:
    return _record(ctx, "step", value + 1)


@flow.effect(idempotent=True)
def notify(ctx: StepContext, value: int) -> dict[str, Any]:
    return _record(ctx, "notify", value + 1)


def find_charge(ctx: StepContext, value: int) -> EffectEvidence:
    """Was this charge made? Fence out older owners first, then read the ledger: only
    then is "not applied" still true when the charge runs again."""

    def look(_accepted: bool) -> EffectEvidence:
        for line in parse_ledger(_workdir() / "ledger.txt"):
            if (line.task_id, line.call_id, line.kind) == (ctx.task_id, ctx.call_id, "charge"):
                return EffectEvidence.applied({"value": line.value, "run": line.run_id, "token": line.token})
        return EffectEvidence.not_applied()

    return _under_fence(ctx.task_id, ctx.fence, look)


@flow.effect(idempotent=False, reconcile=find_charge)
def charge(ctx: StepContext, value: int) -> dict[str, Any]:
    return _record(ctx, "charge", value + 1)


child_flow = Workflow(CHILD_FLOW, 1)


@child_flow.step()
def child_work(ctx: StepContext, value: int) -> dict[str, Any]:
    return _record(ctx, "child", value + 1)


@child_flow.main
def child_main(ctx: WorkflowContext, value: int) -> dict[str, Any]:
    return child_work(ctx, value)


def run_child(ctx: WorkflowContext, value: int) -> dict[str, Any]:
    """The child call of a plan: a durable wait for a child task's one step."""
    result: dict[str, Any] = ctx.run_child(CHILD_FLOW, 1, value, tenant=CHILD_TENANT)
    return result


_BODIES = {"step": work, "notify": notify, "charge": charge, "child": run_child}


@flow.main
def chaos_main(ctx: WorkflowContext, spec: dict[str, Any]) -> dict[str, Any]:
    value: int = spec["start"]
    received: Any = None
    for position, kind in enumerate(spec["plan"]):
        value = _BODIES[kind](ctx, value)["value"]
        if position == spec["timer_after"]:
            ctx.sleep(timedelta(milliseconds=spec["timer_ms"]))
        if position == spec["signal_after"]:
            received = ctx.wait_for_signal(SIGNAL)
    return {"value": value, "signal": received}


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(flow, Budget(max_attempts=MAX_ATTEMPTS), CapabilitySet()))
    reg.register(WorkflowDefinition(child_flow, Budget(max_attempts=MAX_ATTEMPTS), CapabilitySet()))
    return reg


def main() -> None:
    parser = argparse.ArgumentParser(prog="python tools/chaos_app.py")
    parser.add_argument("--url", required=True)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--processes", type=int, required=True)
    parser.add_argument("--lease-s", type=float, required=True)
    parser.add_argument("--heartbeat-s", type=float, required=True)
    parser.add_argument("--claim-batch", type=int, default=1)
    args = parser.parse_args()
    os.environ[WORKDIR_ENV] = str(args.workdir)
    lease = LeaseDuration(timedelta(seconds=args.lease_s))
    heartbeat = timedelta(seconds=args.heartbeat_s)

    def factory(worker_id: WorkerId) -> WorkflowWorker:  # runs in the child, after the fork
        _append(args.workdir / "workers.txt", f"{os.getpid()} {worker_id}\n")
        return WorkflowWorker(
            open_store(args.url), registry(), worker_id, lease, heartbeat, claim_batch=args.claim_batch
        )

    config = (
        WorkflowSupervisorConfig(args.processes)
        .with_backoff(timedelta(milliseconds=10), timedelta(milliseconds=200))
        .with_shutdown_grace(timedelta(seconds=args.lease_s * 5))
    )
    report = WorkflowSupervisor(factory, config, base_id="chaos").run(CancellationToken())
    summary = {"outcomes": report.outcomes, "per_worker": report.per_worker, "restarts": report.restarts}
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
