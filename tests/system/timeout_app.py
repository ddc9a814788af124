"""Workflows with step and effect timeouts, for the tests of ``test_step_timeouts_pool``
and ``test_timeout_crash_points``. The pool tests run them with the CLI
(``python -m runifold_sync run --app tests.system.timeout_app:registry``); the
crash-point cases run :func:`main` here with ``RUNIFOLD_CRASH_AT`` set.

Every body first appends ``<body> <task id> <pid> <attempt> <idempotency key>`` to the
ledger named by ``TIMEOUT_LEDGER`` (``O_APPEND``, fsynced), so a test counts outside the
process what ran, in which process and as which attempt.

- ``stuck``: one step that sleeps for ever, ``timeout=1s``, ``max_attempts=2``;
- ``stuck-effect``: a non-idempotent effect with no reconcile that sleeps for ever;
- ``stuck-reconciled``: the same with a ``reconcile`` that finds the body's ledger line
  and says it was applied;
- ``hang``: a step with no timeout that sleeps for ever (the shutdown grace's case);
- ``timed``: the crash-point flow, a step, an idempotent effect (both with a 30 s
  timeout and three attempts) and a non-idempotent effect with a 1 s timeout, none of
  which hangs.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta
from pathlib import Path

from runifold_sync import (
    EffectEvidence,
    RetryPolicy,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)
from tests.support import ledger

from . import crash_app

LEDGER_ENV = "TIMEOUT_LEDGER"
TIMEOUT = timedelta(seconds=1)
LONG_TIMEOUT = timedelta(seconds=30)
MAX_ATTEMPTS = 2
FOREVER_S = 10**6


def record(body: str, ctx: StepContext) -> None:
    ledger.append(
        Path(os.environ[LEDGER_ENV]), body, ctx.task_id, os.getpid(), ctx.attempt, ctx.idempotency_key
    )


def ledger_lines() -> list[list[str]]:
    return ledger.read(Path(os.environ[LEDGER_ENV]))


stuck = Workflow("stuck", 1)


@stuck.step(timeout=TIMEOUT, retry=RetryPolicy(max_attempts=MAX_ATTEMPTS))
def sleep_for_ever(ctx: StepContext, n: int) -> int:
    record("sleep_for_ever", ctx)
    time.sleep(FOREVER_S)
    return n


@stuck.main
def stuck_main(ctx: WorkflowContext, n: int) -> int:
    return sleep_for_ever(ctx, n)


stuck_effect = Workflow("stuck-effect", 1)


@stuck_effect.effect(idempotent=False, timeout=TIMEOUT)
def charge_for_ever(ctx: StepContext, n: int) -> str:
    record("charge_for_ever", ctx)
    time.sleep(FOREVER_S)
    return "never"


@stuck_effect.main
def stuck_effect_main(ctx: WorkflowContext, n: int) -> str:
    return charge_for_ever(ctx, n)


stuck_reconciled = Workflow("stuck-reconciled", 1)


def find_charge(ctx: StepContext, n: int) -> EffectEvidence:
    for line in ledger_lines():
        if line[0] == "charge_and_hang" and line[4] == ctx.idempotency_key:
            return EffectEvidence.applied(f"charged {ctx.idempotency_key}")
    return EffectEvidence.not_applied()


@stuck_reconciled.effect(idempotent=False, reconcile=find_charge, timeout=TIMEOUT)
def charge_and_hang(ctx: StepContext, n: int) -> str:
    record("charge_and_hang", ctx)  # the charge happened; its answer never comes
    time.sleep(FOREVER_S)
    return "never"


@stuck_reconciled.main
def stuck_reconciled_main(ctx: WorkflowContext, n: int) -> str:
    return charge_and_hang(ctx, n)


hang = Workflow("hang", 1)


@hang.step()
def hang_untimed(ctx: StepContext, n: int) -> int:
    record("hang_untimed", ctx)
    time.sleep(FOREVER_S)
    return n


@hang.main
def hang_main(ctx: WorkflowContext, n: int) -> int:
    return hang_untimed(ctx, n)


timed = Workflow("timed", 1)
RETRIED = RetryPolicy(max_attempts=3)


@timed.step(timeout=LONG_TIMEOUT, retry=RETRIED)
def prepare(ctx: StepContext, order: str) -> str:
    record("prepare", ctx)
    return f"prepared {order}"


@timed.effect(idempotent=True, timeout=LONG_TIMEOUT, retry=RETRIED)
def notify(ctx: StepContext, text: str) -> str:
    record("notify", ctx)
    return f"notified {ctx.idempotency_key}"


@timed.effect(idempotent=False, timeout=TIMEOUT)
def charge(ctx: StepContext, text: str) -> str:
    record("charge", ctx)
    return f"ch-{ctx.idempotency_key}"


@timed.main
def timed_main(ctx: WorkflowContext, order: str) -> dict[str, str]:
    notice = notify(ctx, prepare(ctx, order))
    return {"notice": notice, "charge": charge(ctx, notice)}


def build_registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    for flow in (stuck, stuck_effect, stuck_reconciled, hang, timed):
        reg.register(WorkflowDefinition(flow))
    return reg


registry = build_registry()


def main() -> int:
    """Run the ``timed`` task ``--task`` in this process with run_once until it ends
    (or a crash point kills the process)."""
    return crash_app.drive_one_task("python -m tests.system.timeout_app", build_registry(), LEDGER_ENV)


if __name__ == "__main__":
    sys.exit(main())
