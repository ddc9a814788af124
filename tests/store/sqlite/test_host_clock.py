"""SQLite store time from the host's boot clock (``sqlite_clock``): the same for every
store on the file, untouched by this process's wall clock once anchored, and anchored
again after a reboot never below a time the database already holds."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store.sqlite.clock import HOST_CLOCK
from runifold_sync.store.sqlite.connection import in_us


def test_the_boot_clock_reads_as_proc_uptime_does() -> None:
    uptime_s = float(Path("/proc/uptime").read_text().split()[0])
    assert abs(HOST_CLOCK.uptime_us() / 1e6 - uptime_s) < 0.05


def test_two_stores_on_one_file_read_one_clock_that_never_runs_back(sqlite_path: Path) -> None:
    first, second = SqliteWorkflowStore.open(sqlite_path), SqliteWorkflowStore.open(sqlite_path)
    readings = [store.now() for _ in range(50) for store in (first, second)]
    assert readings == sorted(readings)
    assert abs(time.time() - readings[-1].timestamp()) < 1.0  # anchored to the wall clock at first open
    first.close()
    second.close()


def test_a_wall_clock_step_after_the_anchor_moves_no_store_time(
    sqlite_store: SqliteWorkflowStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = sqlite_store.now()
    real_time_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + 3600 * 10**9)
    monkeypatch.setattr(time, "time", lambda: real_time_ns() / 1e9 + 3600)
    after = SqliteWorkflowStore.open(sqlite_store.path).now()  # a new store: the anchor is kept
    assert timedelta(0) <= after - before < timedelta(seconds=1)


def test_after_a_reboot_the_clock_is_anchored_again_never_below_a_time_the_database_holds(
    sqlite_path: Path,
) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    later = store.now() + timedelta(days=1)  # written by a host whose clock was a day ahead
    store.close()
    with sqlite3.connect(sqlite_path) as conn:
        conn.execute("UPDATE runifold_tasks SET updated_at = ?", (in_us(later),))
        conn.execute("UPDATE runifold_clock SET boot_id = 'an-earlier-boot'")
    reopened = SqliteWorkflowStore.open(sqlite_path)
    assert reopened.now() > later
    with sqlite3.connect(sqlite_path) as conn:
        assert conn.execute("SELECT boot_id FROM runifold_clock").fetchone()[0] == HOST_CLOCK.boot_id
    reopened.close()


def test_another_process_reads_the_same_boot_clock_within_a_millisecond() -> None:
    """Each process calibrates its own monotonic clock against ``/proc/uptime``: the
    child's reading must fall between this process's readings before and after it."""
    before = HOST_CLOCK.uptime_us()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "from runifold_sync.store.sqlite.clock import HOST_CLOCK; print(HOST_CLOCK.uptime_us())",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    after = HOST_CLOCK.uptime_us()
    assert before - 1_000 <= int(child.stdout) <= after + 1_000
