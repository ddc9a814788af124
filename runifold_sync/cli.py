"""``python -m runifold_sync``: a thin click layer over the library.

Each command parses its options, calls one library function and prints. Library errors
become ``ClickException`` here and nowhere else.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from .checkpoint import Checkpoint
from .errors import RunifoldError
from .sqlite import SqliteWorkflowStore


def _fail(exc: RunifoldError) -> click.ClickException:
    return click.ClickException(str(exc))


@click.group()
def main() -> None:
    """Durable workflows for synchronous Python."""


@main.command()
@click.option(
    "--database",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("runifold-demo.db"),
    show_default=True,
    help="SQLite file the demo creates (replaced if it exists).",
)
@click.option("--orders", type=click.IntRange(1, 20), default=3, show_default=True, help="Tasks to enqueue.")
def demo(database: Path, orders: int) -> None:
    """Run an order-intake workflow, SIGKILL its worker mid-step and watch another
    worker finish every task without repeating completed steps."""
    from .demo import STEPS_PER_ORDER, DemoRow, run_demo

    last: list[Any] = []

    def report(phase: str, rows: list[DemoRow]) -> None:
        snapshot = [phase, [(r.state, r.steps_done) for r in rows]]
        if snapshot == last:
            return
        last[:] = snapshot
        progress = "  ".join(f"{r.task_id}:{r.state}[{r.steps_done}/{STEPS_PER_ORDER}]" for r in rows)
        click.echo(f"{phase:<45} {progress}")

    click.echo(f"demo database: {database} (SQLite, synchronous=FULL)")
    rows = run_demo(database, orders, report)
    click.echo("")
    header = (
        f"{'task':<10} {'state':<10} {'steps done':>10} {'bodies started':>15} "
        f"{'fencing token':>14}  last worker"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for r in rows:
        click.echo(
            f"{r.task_id:<10} {r.state:<10} {r.steps_done:>10} {r.step_runs:>15} "
            f"{r.fencing_token:>14}  {r.last_worker}"
        )
    repeated = sum(r.step_runs - r.steps_done for r in rows)
    click.echo(
        f"\n{sum(r.state == 'completed' for r in rows)}/{len(rows)} completed. "
        f"Step bodies started again after the kill: {repeated} (only the step in flight "
        "may run again; completed steps are replayed from the checkpoint)."
    )
    if any(r.state != "completed" for r in rows):
        sys.exit(1)


@main.command()
@click.option(
    "--database", type=click.Path(dir_okay=False, path_type=Path), required=True, help="SQLite file."
)
def migrate(database: Path) -> None:
    """Create or upgrade the schema of a store."""
    try:
        with SqliteWorkflowStore.open(database) as store:
            version = store.migrate()
    except RunifoldError as exc:
        raise _fail(exc) from exc
    click.echo(f"schema version {version}")


@main.command()
@click.argument("task_id")
@click.option(
    "--database", type=click.Path(dir_okay=False, path_type=Path), required=True, help="SQLite file."
)
@click.option("--json", "as_json", is_flag=True, help="Print the task and its history as JSON.")
def show(task_id: str, database: Path, as_json: bool) -> None:
    """Show a task's state, why it is not running, its checkpoint and its history."""
    try:
        with SqliteWorkflowStore.open(database) as store:
            record = store.get_task(task_id)
            events = store.history(task_id)
    except RunifoldError as exc:
        raise _fail(exc) from exc
    journal = []
    usage: dict[str, Any] = {}
    if record.checkpoint_json:
        checkpoint = Checkpoint.decode(task_id, record.checkpoint_json)
        journal = [f"{e.call_id} ({e.kind}, {e.status})" for e in checkpoint.journal]
        usage = {
            "steps": checkpoint.usage.steps,
            "cost": checkpoint.usage.cost,
            "claims": checkpoint.usage.claims,
        }
    if as_json:
        click.echo(
            json.dumps(
                {
                    "task_id": record.task_id,
                    "definition": record.definition_name,
                    "version": record.definition_version,
                    "state": record.state.value,
                    "outcome": None if record.outcome is None else record.outcome.value,
                    "reason": record.reason,
                    "ambiguous_effect": record.ambiguous_effect,
                    "revision": record.revision,
                    "fencing_token": record.fencing_token,
                    "journal": journal,
                    "usage": usage,
                    "result": record.result,
                    "history": [
                        {
                            "at": e.at.isoformat(),
                            "kind": e.kind,
                            "worker": e.worker_id,
                            "token": e.fencing_token,
                            "detail": e.detail,
                        }
                        for e in events
                    ],
                },
                indent=2,
            )
        )
        return
    click.echo(f"task {record.task_id}: {record.definition_name} v{record.definition_version}")
    click.echo(f"state: {record.state.value}" + (f" ({record.outcome.value})" if record.outcome else ""))
    if record.reason:
        click.echo(f"reason: {record.reason}")
    click.echo(f"revision {record.revision}, fencing token {record.fencing_token}, usage {usage}")
    for line in journal:
        click.echo(f"  {line}")
    click.echo("history:")
    for e in events:
        click.echo(f"  {e.at.isoformat()} {e.kind:<16} {e.worker_id or '-':<16} {e.detail}")
