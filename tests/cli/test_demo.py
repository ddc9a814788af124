"""The README's demo command, run as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runifold_sync.checkpoint import Checkpoint
from runifold_sync.sqlite import SqliteWorkflowStore


@pytest.mark.timeout(120)
def test_demo_kills_a_worker_mid_step_and_every_order_completes(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    proc = subprocess.run(
        [sys.executable, "-m", "runifold_sync", "demo", "--database", str(db), "--orders", "3"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SIGKILLed pid" in proc.stdout and "3/3 completed" in proc.stdout
    ledger = (tmp_path / "demo.ledger").read_text().splitlines()
    calls = [line.split()[:2] for line in ledger]
    # Each (task, call) ran once except at most the one step that was in flight.
    repeats = len(calls) - len({tuple(c) for c in calls})
    assert repeats <= 1
    with SqliteWorkflowStore.open(db) as store:
        for n in (1, 2, 3):
            record = store.get_task(f"order-{n}")
            checkpoint = Checkpoint.decode(record.task_id, record.checkpoint_json or "")
            assert record.result["order_id"] == f"order-{n}"
            assert [e.call_id for e in checkpoint.journal] == [
                "validate#1",
                "reserve_stock#1",
                "charge_card#1",
                "timer#1",
                "ship#1",
            ]
