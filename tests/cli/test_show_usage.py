"""``show`` prints the task's budget usage, run time included."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore


def test_show_prints_the_run_time_in_the_usage(sqlite_path: Path) -> None:
    wf = Workflow("timed", 1)

    @wf.step()
    def work(ctx: StepContext) -> None:
        time.sleep(0.2)
        ctx.charge(1.5)

    @wf.main
    def run(ctx: WorkflowContext, _input: None) -> None:
        work(ctx)

    store = SqliteWorkflowStore.open(sqlite_path)
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(wf))
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10)
    )
    store.enqueue(WorkflowTask.new("timed", 1, None, checkpoint_id="t1"))
    assert worker.run_once().kind == "completed"
    worker.close()
    store.close()

    result = CliRunner().invoke(main, ["show", "t1", "--database", f"sqlite:///{sqlite_path}"])

    assert result.exit_code == 0, result.output
    usage = re.search(
        r"usage \{'steps': 1, 'cost': 1.5, 'elapsed_s': ([0-9.]+), 'claims': 1\}", result.output
    )
    assert usage is not None, result.output
    assert float(usage.group(1)) >= 0.2
