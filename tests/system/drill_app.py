"""Workflows for the recovery drill and a one-shot worker process that runs them.

    python -m tests.system.drill_app --url URL --worker-id ID --ledger PATH \
        --lease-s X --heartbeat-s Y [--registry v1|v2|both] [--block-at STEP] [--until-idle]

The process opens its own store after it starts (nothing crosses a fork), runs
``run_once()`` once (or until it returns ``Idle`` with ``--until-idle``, at most
``MAX_RUNS`` times) and prints every outcome as one JSON line on stdout.

Every step and effect body first appends ``"<step id> <task id> <pid>"`` to the ledger
file (``O_APPEND``, fsynced), so the test can count outside the process what really ran,
and wait for a process to be inside a step by waiting for its line. The body named by
``--block-at`` then blocks until the file ``<ledger>.release.<worker id>`` exists, which
lets the test kill or stop the process while it is in that step, and let each blocked
worker go on separately.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import attrs

from runifold_sync import (
    Budget,
    CapabilitySet,
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
from runifold_sync.outcomes import RunOutcome
from tests.support import ledger

MAX_RUNS = 20
BLOCK_LIMIT_S = 120.0  # a blocked step gives up eventually, so no orphan lives forever
POISON_MAX_ATTEMPTS = 3
REPORT_SLEEP = timedelta(seconds=60)

_ledger_path: str | None = None
_block_at: str | None = None
_worker_id: str | None = None


def record(step_id: str, ctx: StepContext) -> None:
    """Append this step's ledger line durably, then block if told to block here."""
    assert _ledger_path is not None, "drill_app.configure() was not called"
    ledger.append(_ledger_path, step_id, ctx.task_id, os.getpid())
    if step_id == _block_at:
        release = f"{_ledger_path}.release.{_worker_id}"
        deadline = time.monotonic() + BLOCK_LIMIT_S
        while not os.path.exists(release):
            if time.monotonic() > deadline:
                raise TimeoutError(f"step {step_id} was never released")
            time.sleep(0.02)


# --- "drill": four deterministic steps, each charging one cost unit ------------------

drill = Workflow("drill", 1)


@drill.step()
def s1(ctx: StepContext, n: int) -> int:
    record("s1", ctx)
    ctx.charge(1)
    return n + 1


@drill.step()
def s2(ctx: StepContext, n: int) -> int:
    record("s2", ctx)
    ctx.charge(1)
    return n * 10


@drill.step()
def s3(ctx: StepContext, n: int) -> int:
    record("s3", ctx)
    ctx.charge(1)
    return n + 3


@drill.step()
def s4(ctx: StepContext, n: int) -> int:
    record("s4", ctx)
    ctx.charge(1)
    return n * 2


@drill.main
def drill_main(ctx: WorkflowContext, start: int) -> dict[str, int]:
    return {"value": s4(ctx, s3(ctx, s2(ctx, s1(ctx, start))))}


# --- "payment": a non-idempotent external write between two steps -------------------

payment = Workflow("payment", 1)


@payment.step()
def prepare(ctx: StepContext, order_id: str) -> str:
    record("prepare", ctx)
    return f"amount-for-{order_id}"


@payment.effect(idempotent=False)
def charge_card(ctx: StepContext, amount: str) -> dict[str, str]:
    record("charge_card", ctx)
    return {"charge_id": f"ch-live-{os.getpid()}", "key": str(ctx.idempotency_key)}


@payment.step()
def send_receipt(ctx: StepContext, charge: dict[str, str]) -> str:
    record("send_receipt", ctx)
    return f"receipt for {charge['charge_id']}"


@payment.main
def payment_main(ctx: WorkflowContext, order_id: str) -> dict[str, Any]:
    charge = charge_card(ctx, prepare(ctx, order_id))
    return {"charge": charge, "receipt": send_receipt(ctx, charge)}


# --- "report": version 1 waits on a timer; version 2 has a different step graph -------

report_v1 = Workflow("report", 1)


@report_v1.step()
def collect(ctx: StepContext, name: str) -> str:
    record("collect", ctx)
    return f"rows of {name}"


@report_v1.step()
def publish(ctx: StepContext, rows: str) -> str:
    record("publish", ctx)
    return f"published {rows}"


@report_v1.main
def report_v1_main(ctx: WorkflowContext, name: str) -> dict[str, Any]:
    rows = collect(ctx, name)
    ctx.sleep(REPORT_SLEEP)
    return {"version": 1, "output": publish(ctx, rows)}


report_v2 = Workflow("report", 2)


@report_v2.step()
def collect_all(ctx: StepContext, name: str) -> list[str]:
    record("collect_all", ctx)
    return [f"rows of {name}", f"archive of {name}"]


@report_v2.step()
def score(ctx: StepContext, rows: list[str]) -> int:
    record("score", ctx)
    return len(rows)


@report_v2.step()
def publish_scored(ctx: StepContext, count: int) -> str:
    record("publish_scored", ctx)
    return f"published {count} sources"


@report_v2.main
def report_v2_main(ctx: WorkflowContext, name: str) -> dict[str, Any]:
    return {"version": 2, "output": publish_scored(ctx, score(ctx, collect_all(ctx, name)))}


# --- "poison": its only step kills its own worker every time --------------------------

poison = Workflow("poison", 1)


@poison.step()
def explode(ctx: StepContext, n: int) -> int:
    record("explode", ctx)
    os.kill(os.getpid(), signal.SIGKILL)
    return n  # never reached


@poison.main
def poison_main(ctx: WorkflowContext, n: int) -> int:
    return explode(ctx, n)


def build_registry(which: str) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    if which in ("v1", "both"):
        registry.register(WorkflowDefinition(drill, Budget(), CapabilitySet()))
        registry.register(WorkflowDefinition(payment, Budget(), CapabilitySet()))
        registry.register(WorkflowDefinition(report_v1, Budget(), CapabilitySet()))
        registry.register(
            WorkflowDefinition(poison, Budget(max_attempts=POISON_MAX_ATTEMPTS), CapabilitySet())
        )
    if which in ("v2", "both"):
        registry.register(WorkflowDefinition(report_v2, Budget(), CapabilitySet()))
    return registry


def outcome_json(outcome: RunOutcome) -> str:
    fields = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in attrs.asdict(outcome).items()}
    return json.dumps({"kind": outcome.kind, "pid": os.getpid(), **fields}, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    global _ledger_path, _block_at, _worker_id
    parser = argparse.ArgumentParser(prog="python -m tests.system.drill_app")
    parser.add_argument("--url", required=True, help="store URL: sqlite:///... or postgresql://...")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--lease-s", type=float, required=True)
    parser.add_argument("--heartbeat-s", type=float, required=True)
    parser.add_argument("--registry", choices=("v1", "v2", "both"), default="v1")
    parser.add_argument("--block-at", default=None)
    parser.add_argument("--until-idle", action="store_true")
    args = parser.parse_args(argv)
    _ledger_path, _block_at, _worker_id = args.ledger, args.block_at, args.worker_id

    # Warnings (a lease lost, and the store's refusal that told) go to stderr for the test.
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    store = open_store(args.url)
    worker = WorkflowWorker(
        store,
        build_registry(args.registry),
        WorkerId.parse(args.worker_id),
        LeaseDuration(timedelta(seconds=args.lease_s)),
        timedelta(seconds=args.heartbeat_s),
    )
    try:
        for _ in range(MAX_RUNS if args.until_idle else 1):
            outcome = worker.run_once()
            print(outcome_json(outcome), flush=True)
            if outcome.kind == "idle":
                break
    finally:
        worker.close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
