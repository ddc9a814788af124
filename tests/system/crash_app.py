"""The workflow of the crash-point matrix and a worker process that runs it.

    RUNIFOLD_CRASH_AT=point[:subject] python -m tests.system.crash_app --url URL --ledger PATH

``crashy`` makes one call of every kind the lease protocol has: a slow step (long enough
for heartbeats to run beside it), an idempotent effect, a non-idempotent effect with no
way to reconcile it, a non-idempotent effect whose ``reconcile`` reads the ledger, a
signal wait (the test sends the signal before the run), an event published
(``ctx.set_event``), a durable timer and a last step. An order named ``again:<order>``
first runs ``prepare`` alone and continues as new with ``<order>`` (the continue
transition's cases). Each body appends ``<call id> <task> <pid> <idempotency key>`` to
the ledger (``O_APPEND``, fsynced), so the test counts what really ran; the slow first
step records itself before it sleeps, so a crash during its heartbeats leaves its line.

Two variables of the crashing process change ``prepare`` for the cases of the other
claim-ending writes: with ``CRASH_FLAKY`` set its first run for a task fails (a retry);
``CRASH_SLOW_S`` is how long it sleeps.

The process runs ``run_once`` until the task is terminal or cancelled, nothing was
claimable for a while, or ``--cycles`` cycles ran, printing each outcome kind; with a
crash point armed it is expected to die of SIGKILL on the way. ``--claim-batch``,
``--max-steps`` and ``--no-definitions`` set up tasks claimed ahead, a step slice and a
task checkpointed by steps this worker lacks (claimed before its fingerprint was known).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

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
from runifold_sync.store import TaskState
from tests.support import ledger
from tests.support.routing import leave_checkpoint_without_fingerprint

LEDGER_ENV = "CRASH_LEDGER"
FLAKY_ENV = "CRASH_FLAKY"
SLOW_ENV = "CRASH_SLOW_S"
LEASE = LeaseDuration(timedelta(seconds=2))
HEARTBEAT = timedelta(seconds=0.1)
SLOW_STEP_S = 0.3  # heartbeats run beside the first step
TIMER = timedelta(milliseconds=200)
IDLE_LIMIT_S = 3.0
BODIES = ("prepare", "notify", "charge", "ship", "finish")
RENEW = "again:"  # an order so named runs prepare, then continues as new with the rest of its name

flow = Workflow("crashy", 1, signals=["go"])


def _ledger() -> Path:
    return Path(os.environ[LEDGER_ENV])


def record(step: str, ctx: StepContext) -> None:
    ledger.append(_ledger(), step, ctx.task_id, os.getpid(), ctx.idempotency_key)


def ledger_lines() -> list[list[str]]:
    return ledger.read(_ledger())


@flow.step()
def prepare(ctx: StepContext, order: str) -> str:
    record("prepare", ctx)
    if (
        os.environ.get(FLAKY_ENV)
        and sum(line[:2] == ["prepare", ctx.task_id] for line in ledger_lines()) == 1
    ):
        raise RuntimeError("the first run of prepare fails")
    time.sleep(float(os.environ.get(SLOW_ENV, SLOW_STEP_S)))
    return f"prepared {order}"


@flow.effect(idempotent=True)
def notify(ctx: StepContext, text: str) -> str:
    record("notify", ctx)
    return f"notified {ctx.idempotency_key}"


@flow.effect(idempotent=False)
def charge(ctx: StepContext, text: str) -> dict[str, str]:
    record("charge", ctx)
    return {"charge": f"ch-{ctx.idempotency_key}"}


def find_shipment(ctx: StepContext, charge: dict[str, str]) -> EffectEvidence:
    for line in ledger_lines():
        if line[0] == "ship" and line[3] == ctx.idempotency_key:
            return EffectEvidence.applied(f"shipped {ctx.idempotency_key}")
    return EffectEvidence.not_applied()


@flow.effect(idempotent=False, reconcile=find_shipment)
def ship(ctx: StepContext, charge: dict[str, str]) -> str:
    record("ship", ctx)
    return f"shipped {ctx.idempotency_key}"


@flow.step()
def finish(ctx: StepContext, shipment: str) -> str:
    record("finish", ctx)
    return "done"


@flow.main
def crashy_main(ctx: WorkflowContext, order: str) -> dict[str, Any]:
    if order.startswith(RENEW):  # a first run of one step, then the whole flow as run 2
        prepare(ctx, order)
        ctx.continue_as_new(order.removeprefix(RENEW))
    notice = notify(ctx, prepare(ctx, order))
    receipt = charge(ctx, notice)
    shipment = ship(ctx, receipt)
    approval = ctx.wait_for_signal("go")
    ctx.set_event("approval", approval)
    ctx.sleep(TIMER)
    end = finish(ctx, shipment)
    return {"charge": receipt["charge"], "shipment": shipment, "approval": approval, "end": end}


def registry(*, other_steps: bool = False) -> WorkflowRegistry:
    """The app's registry; ``other_steps``: crashy v1 as a deploy that changed its steps
    (another fingerprint) has it."""
    reg = WorkflowRegistry()
    if other_steps:
        changed = Workflow("crashy", 1, signals=["go"])

        @changed.step()
        def elsewhere(ctx: StepContext, order: str) -> str:
            return order

        @changed.main
        def changed_main(ctx: WorkflowContext, order: str) -> str:
            return elsewhere(ctx, order)

        reg.register(WorkflowDefinition(changed, Budget(), CapabilitySet()))
    else:
        reg.register(WorkflowDefinition(flow, Budget(), CapabilitySet()))
    return reg


def drive(
    worker: WorkflowWorker, task_id: str, idle_limit_s: float = IDLE_LIMIT_S, cycles: int | None = None
) -> list[str]:
    """Run cycles until the task is terminal or cancelled, nothing was claimable for
    ``idle_limit_s``, or ``cycles`` cycles ran."""
    kinds: list[str] = []
    idle_since = time.monotonic()
    while worker.store.get_task(task_id).state not in (TaskState.TERMINAL, TaskState.CANCELLED):
        if cycles is not None and len(kinds) >= cycles:
            break
        outcome = worker.run_once()
        kinds.append(outcome.kind)
        if outcome.kind != "idle":
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > idle_limit_s:
            break
        else:
            time.sleep(0.02)
    return kinds


def drive_one_task(prog: str, worker_registry: WorkflowRegistry, ledger_env: str = LEDGER_ENV) -> int:
    """The main of a small crash-case app: ``--url``, ``--ledger`` (exported as
    ``ledger_env``, where that app's steps write) and ``--task``, one worker serving
    ``worker_registry`` driving that task (``drive``) to its end or its armed crash point."""
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--url", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--task", required=True)
    args = parser.parse_args()
    os.environ[ledger_env] = args.ledger
    store = open_store(args.url)
    worker = WorkflowWorker(store, worker_registry, WorkerId.parse(f"crash-{os.getpid()}"), LEASE, HEARTBEAT)
    try:
        print(" ".join(drive(worker, args.task)), flush=True)
    finally:
        worker.close()
        store.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.system.crash_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--task", required=True)
    parser.add_argument("--cycles", type=int)
    parser.add_argument("--claim-batch", type=int, default=1)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--no-definitions", action="store_true")
    args = parser.parse_args()
    os.environ[LEDGER_ENV] = args.ledger
    store = open_store(args.url)
    if args.no_definitions:
        # A routed claim never hands this worker a task it lacks: what still reaches it is a
        # task checkpointed (by the real steps) under a claim that recorded no fingerprint.
        leave_checkpoint_without_fingerprint(store, WorkflowDefinition(flow).identity.fingerprint)
    worker = WorkflowWorker(
        store,
        registry(other_steps=args.no_definitions),
        WorkerId.parse(f"crash-{os.getpid()}"),
        LEASE,
        HEARTBEAT,
        max_steps_per_claim=args.max_steps,
        claim_batch=args.claim_batch,
    )
    try:
        print(" ".join(drive(worker, args.task, cycles=args.cycles)), flush=True)
    finally:
        worker.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
