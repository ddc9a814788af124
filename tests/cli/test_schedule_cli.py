"""The schedule commands: ``schedules`` (text and ``--json``), ``schedule pause`` and
``resume`` (audited, shown in ``schedule history``), and an unknown name."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.worker.schedule_ticker import ScheduleTicks
from tests.support.clock import Clock
from tests.system import schedule_app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    opened = SqliteWorkflowStore.open(sqlite_path)
    yield opened
    opened.close()


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout


def test_schedules_lists_each_with_its_last_and_next_tick(url: str, store: SqliteWorkflowStore) -> None:
    assert _invoke("schedules", "--database", url) == (
        0,
        "no schedules stored (a worker whose registry adds one stores it when it starts)\n",
    )
    registry = schedule_app.registry()
    ticks = ScheduleTicks(store, registry)
    ticks.run()
    (hourly,) = [s for s in registry.schedules if s.name == "hourly"]
    tick = hourly.times.next_after(store.schedule("hourly").active_since)
    Clock(store).advance(tick + timedelta(seconds=30) - store.now())
    assert hourly.task_id(tick) in ticks.run().created

    code, out = _invoke("schedules", "--database", url, "--json")
    assert code == 0
    listed = {s["name"]: s for s in json.loads(out)}
    assert sorted(listed) == ["every-second", "hourly"]
    assert listed["hourly"] | {"active_since": None, "declared_at": None} == {
        "name": "hourly",
        "workflow": "ticked",
        "version": 1,
        "expression": "every 1h",
        "cron": None,
        "every_s": 3600,
        "timezone": "UTC",
        "input": {"report": "usage"},
        "last_tick": hourly.task_id(tick).rpartition("hourly:")[2],
        "next_tick": hourly.task_id(tick + timedelta(hours=1)).rpartition("hourly:")[2],
        "paused": False,
        "paused_at": None,
        "paused_by": None,
        "paused_reason": None,
        "active_since": None,
        "declared_at": None,
        "origin": "declared",
        "queue": None,
        "no_live_worker_declares": True,  # ScheduleTicks here, no worker
    }

    code, out = _invoke("schedules", "--database", url)
    header, *rows = out.splitlines()
    assert header.split() == ["name", "definition", "expression", "timezone", "last", "tick", "next", "tick"]
    line = next(r for r in rows if r.startswith("hourly "))
    assert line.split() == [
        "hourly",
        "ticked",
        "v1",
        "every",
        "1h",
        "UTC",
        listed["hourly"]["last_tick"],
        listed["hourly"]["next_tick"],
        *"[no live worker declares it]".split(),
    ]


def test_pause_and_resume_are_audited_and_shown(url: str, store: SqliteWorkflowStore) -> None:
    store.declare_schedules(schedule_app.registry().schedules)
    audit = ("--actor", "alice", "--reason", "warehouse migration", "--database", url)
    assert _invoke("schedule", "pause", "hourly", *audit) == (0, "schedule hourly: paused\n")
    code, out = _invoke("schedules", "--database", url)
    assert "paused by alice: warehouse migration" in next(
        r for r in out.splitlines() if r.startswith("hourly ")
    )
    listed = {s["name"]: s for s in json.loads(_invoke("schedules", "--database", url, "--json")[1])}
    assert (listed["hourly"]["paused"], listed["hourly"]["next_tick"]) == (True, None)
    assert listed["every-second"]["paused"] is False

    code, out = _invoke(
        "schedule", "resume", "hourly", "--actor", "bob", "--reason", "done", "--database", url, "--json"
    )
    assert code == 0 and json.loads(out)["paused"] is False
    code, out = _invoke("schedule", "history", "hourly", "--database", url, "--json")
    assert [(e["kind"], e["actor"], e["reason"]) for e in json.loads(out)] == [
        ("declared", None, None),
        ("paused", "alice", "warehouse migration"),
        ("resumed", "bob", "done"),
    ]
    code, out = _invoke("schedule", "history", "hourly", "--database", url)
    assert [line.split()[1:4] for line in out.splitlines()] == [
        ["declared", "{'expression':", "'every"],
        ["paused", "by", "alice:"],
        ["resumed", "by", "bob:"],
    ]


def test_an_unknown_schedule_or_a_missing_reason_is_an_error(url: str, store: SqliteWorkflowStore) -> None:
    store.migrate()
    result = CliRunner().invoke(
        main, ["schedule", "pause", "nightly", "--actor", "a", "--reason", "b", "--database", url]
    )
    assert result.exit_code == 1
    assert "no schedule named 'nightly' is stored" in result.output
    result = CliRunner().invoke(main, ["schedule", "history", "nightly", "--database", url])
    assert result.exit_code == 1 and "no schedule named 'nightly'" in result.output
    result = CliRunner().invoke(main, ["schedule", "pause", "hourly", "--actor", "a", "--database", url])
    assert result.exit_code == 2 and "Missing option '--reason'" in result.output


def test_every_schedule_command_has_help() -> None:
    for args in (
        ["schedules"],
        ["schedule"],
        ["schedule", "pause"],
        ["schedule", "resume"],
        ["schedule", "remove"],
        ["schedule", "history"],
    ):
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output
    assert "Pause schedule NAME" in CliRunner().invoke(main, ["schedule", "pause", "--help"]).output
