"""``show`` prints a failed step's traceback under its ``failed`` event, line by line,
and ``show --json`` gives it in the event's detail."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from runifold_sync import (
    LeaseDuration,
    RetryPolicy,
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


def _fail_a_task(sqlite_path: Path) -> str:
    wf = Workflow("breaks", 1)

    @wf.step(retry=RetryPolicy(max_attempts=1))
    def load(ctx: StepContext) -> None:
        raise FileNotFoundError("orders.csv")

    @wf.main
    def run(ctx: WorkflowContext, _input: None) -> None:
        load(ctx)

    store = SqliteWorkflowStore.open(sqlite_path)
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(wf))
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)), timedelta(seconds=10)
    )
    store.enqueue(WorkflowTask.new("breaks", 1, None, checkpoint_id="t1"))
    assert worker.run_once().kind == "failed"
    worker.close()
    store.close()
    return f"sqlite:///{sqlite_path}"


def test_show_prints_the_traceback_indented_under_the_failed_event(sqlite_path: Path) -> None:
    url = _fail_a_task(sqlite_path)

    result = CliRunner().invoke(main, ["show", "t1", "--database", url])

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    (at,) = [n for n, line in enumerate(lines) if " failed " in line]
    assert "'error_class': 'FileNotFoundError'" in lines[at] and "traceback" not in lines[at]
    trace = lines[at + 1 :]
    assert trace[0] == "      Traceback (most recent call last):"
    assert all(line.startswith("      ") for line in trace)
    assert any(line.strip() == 'raise FileNotFoundError("orders.csv")' for line in trace)
    assert trace[-1] == "      FileNotFoundError: orders.csv"


def test_show_json_gives_the_traceback_in_the_failed_events_detail(sqlite_path: Path) -> None:
    url = _fail_a_task(sqlite_path)

    result = CliRunner().invoke(main, ["show", "t1", "--database", url, "--json"])

    assert result.exit_code == 0, result.output
    failed = json.loads(result.output)["history"][-1]
    assert failed["kind"] == "failed"
    assert failed["detail"]["traceback"].startswith("Traceback (most recent call last):\n")
    assert failed["detail"]["traceback"].endswith("FileNotFoundError: orders.csv\n")
