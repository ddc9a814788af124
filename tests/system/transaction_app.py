"""The workflow of the transaction-step crash-point cases, and a worker process for it.

    RUNIFOLD_CRASH_AT=point[:subject] python -m tests.system.transaction_app --url URL --task T

``booking`` runs one ``@workflow.transaction()`` step that inserts a row into
``app_ledger`` (the application's table, in the store's database) through
``ctx.connection``, then a plain step. Each body also appends to the ledger file, so the
test counts what ran.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

from runifold_sync import (
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
)
from tests.support import ledger

from .crash_app import LEDGER_ENV, drive_one_task

TABLE = "CREATE TABLE IF NOT EXISTS app_ledger (task_id TEXT NOT NULL, attempt INTEGER NOT NULL)"
flow = Workflow("booking", 1)


def _record(body: str, ctx: StepContext) -> None:
    ledger.append(Path(os.environ[LEDGER_ENV]), body, ctx.task_id, os.getpid())


@flow.transaction()
def book(ctx: StepContext, order: str) -> str:
    _record("book", ctx)
    conn: Any = ctx.connection
    marker = "?" if isinstance(conn, sqlite3.Connection) else "%s"
    conn.execute(
        f"INSERT INTO app_ledger (task_id, attempt) VALUES ({marker}, {marker})", (ctx.task_id, ctx.attempt)
    )
    return f"booked {order}"


@flow.step()
def confirm(ctx: StepContext, booked: str) -> str:
    _record("confirm", ctx)
    return f"{booked}, confirmed"


@flow.main
def booking_main(ctx: WorkflowContext, order: str) -> str:
    return confirm(ctx, book(ctx, order))


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(flow))
    return reg


if __name__ == "__main__":
    sys.exit(drive_one_task("python -m tests.system.transaction_app", registry()))
