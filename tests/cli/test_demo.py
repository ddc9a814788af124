"""The README's demo command, run as a user would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.checkpoints import read_checkpoint

KILL_LINE = re.compile(r"SIGKILLed pid (\d+) in (\S+) of (\S+) ")
RESTART_LINE = re.compile(r"slot restarted as pid (\d+); recovering ")
TABLE_HEADER = "task       state      steps done  bodies started  fencing token  last worker"


def _check_narration(stdout: str, orders: int) -> tuple[int, str, str]:
    """The demo's text output, line by line: progress before the kill, the kill, the
    restarted slot, the final table (one completed row per order) and the summary.
    Returns the killed pid, call id and task id."""
    lines = stdout.splitlines()
    [kill_at] = [n for n, line in enumerate(lines) if KILL_LINE.match(line)]
    before = lines[1:kill_at]
    assert len(before) >= 2 and all(f"order-{orders}:" in line for line in before)
    kill = KILL_LINE.match(lines[kill_at])
    assert kill is not None
    pid, call_id, task_id = kill.groups()
    restarts = {m.group(1) for line in lines[kill_at + 1 :] if (m := RESTART_LINE.match(line))}
    assert len(restarts) == 1 and restarts != {pid}
    header_at = lines.index(TABLE_HEADER)
    rows = [line.split()[:4] for line in lines[header_at + 2 : header_at + 2 + orders]]
    assert [row[:3] for row in rows] == [[f"order-{n}", "completed", "4"] for n in range(1, orders + 1)]
    assert sorted(int(row[3]) for row in rows) == [4] * (orders - 1) + [5]  # bodies started
    assert lines[header_at + 2 + orders] == ""
    assert lines[header_at + 3 + orders].startswith(
        f"{orders}/{orders} completed. Step bodies started again after the kill: 1 "
    )
    return int(pid), call_id, task_id


@pytest.mark.timeout(120)
def test_demo_kills_a_worker_inside_a_step_body_and_only_that_body_runs_again(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    proc = subprocess.run(
        [sys.executable, "-m", "runifold_sync", "demo", "--database", f"sqlite:///{db}", "--orders", "3"],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    pid, call_id, task_id = _check_narration(proc.stdout, 3)
    ledger = [line.split() for line in (tmp_path / "demo.ledger").read_text().splitlines()]
    # The killed body started and never ended; it ran again, to its end, in another process.
    assert [task_id, call_id, str(pid), "start"] in ledger
    assert [task_id, call_id, str(pid), "end"] not in ledger
    reruns = [line[2] for line in ledger if line[:2] == [task_id, call_id] and line[3] == "end"]
    assert len(reruns) == 1 and reruns != [str(pid)]
    # Every other body started exactly once.
    starts = Counter((t, c) for t, c, _pid, mark in ledger if mark == "start")
    assert starts.pop((task_id, call_id)) == 2
    assert set(starts.values()) == {1} and len(starts) == 3 * 4 - 1
    with SqliteWorkflowStore.open(db) as store:
        for n in (1, 2, 3):
            record = store.get_task(f"order-{n}")
            checkpoint = read_checkpoint(store, record.task_id)
            assert checkpoint is not None
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
    assert proc.stdout.startswith("demo store: sqlite:///runifold-demo.db\n")
    _check_narration(proc.stdout, 4)
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
    assert re.fullmatch(
        r"pid \d+ in (validate|reserve_stock|charge_card|ship)#1 of order-[12]", report["killed"]
    )
    assert [(o["task_id"], o["state"], o["steps_done"]) for o in report["orders"]] == [
        ("order-1", "completed", 4),
        ("order-2", "completed", 4),
    ]
    assert report["completed"] == 2 and report["step_bodies_repeated"] == 1


def test_demo_refuses_a_plain_path_and_names_it(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from runifold_sync.cli.main import main

    result = CliRunner().invoke(main, ["demo", "--database", str(tmp_path / "demo.db")])
    assert result.exit_code == 1 and f"unsupported store URL '{tmp_path / 'demo.db'}'" in result.output
