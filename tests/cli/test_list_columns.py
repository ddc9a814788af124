"""``list``'s text table keeps its columns in line whatever the length of a task id,
definition name or tenant: each column is as wide as its widest value."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from runifold_sync import WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore


def test_long_values_widen_their_column_and_every_row_stays_in_line(sqlite_path: Path) -> None:
    long_id = "invoice-2026-12-24-customer-000000042-attempt-7-of-a-very-long-run"
    long_name = "quarterly-reconciliation-of-every-ledger"
    with SqliteWorkflowStore.open(sqlite_path) as store:
        store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
        store.enqueue(
            WorkflowTask.new(long_name, 2, None, checkpoint_id=long_id, tenant="acme-holdings-europe")
        )
    result = CliRunner().invoke(
        main, ["list", "--database", f"sqlite:///{sqlite_path}"], catch_exceptions=False
    )
    assert result.exit_code == 0
    header, short, long = result.stdout.splitlines()
    for title, values in (
        ("definition", ("orders v1", f"{long_name} v2")),
        ("tenant", ("default", "acme-holdings-europe")),
        ("state", ("queued", "queued")),
    ):
        at = header.index(title)
        assert short[at:].startswith(values[0]) and long[at:].startswith(values[1]), title
    assert short.index("orders v1") == len(long_id) + 1  # the id column is as wide as the longest id
