"""The README's demo command, run as a user would."""

from __future__ import annotations

import json
import os
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
        [sys.executable, "-m", "runifold_sync", "demo", "--database", f"sqlite:///{db}", "--orders", "3"],
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


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(150)
def test_demo_with_no_options_writes_its_store_in_the_working_directory_and_completes_every_order(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "runifold_sync", "demo"],
        cwd=tmp_path,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=140,
    )
    assert proc.returncode == 0, proc.stderr
    assert "demo store: sqlite:///runifold-demo.db" in proc.stdout
    assert "SIGKILLed pid" in proc.stdout and "4/4 completed" in proc.stdout
    with SqliteWorkflowStore.open(tmp_path / "runifold-demo.db") as store:
        assert [store.get_task(f"order-{n}").outcome.value for n in range(1, 5)] == ["completed"] * 4


@pytest.mark.timeout(120)
def test_demo_json_reports_the_kill_and_every_order(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    proc = subprocess.run(
        [sys.executable, "-m", "runifold_sync", "demo", "--database", f"sqlite:///{db}", "--orders", "2"]
        + ["--json"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["database"] == f"sqlite:///{db}"
    assert report["killed"].startswith("pid ")
    assert [(o["task_id"], o["state"], o["steps_done"]) for o in report["orders"]] == [
        ("order-1", "completed", 4),
        ("order-2", "completed", 4),
    ]
    assert report["completed"] == 2 and 0 <= report["step_bodies_repeated"] <= 1


def test_demo_refuses_a_plain_path_and_names_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from runifold_sync.cli import main

    result = CliRunner().invoke(main, ["demo", "--database", str(tmp_path / "demo.db")])
    assert result.exit_code == 1 and f"unsupported store URL '{tmp_path / 'demo.db'}'" in result.output
