"""Operator commands through the CLI: ``resolve`` settling an ambiguous effect so the
task completes, ``list --definition``, and ``show``'s text output."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner

from runifold_sync import WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.errors import SignalRefused
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome, TaskState

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.cli.outcome_app:registry"


@pytest.fixture
def url(sqlite_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{sqlite_path}"
    monkeypatch.setenv("OUTCOME_DATABASE_URL", url)
    return url


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    opened = SqliteWorkflowStore.open(sqlite_path)
    yield opened
    opened.close()


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _fail_on_ambiguous_charge(url: str, store: SqliteWorkflowStore) -> str:
    """A worker process dies inside the charge effect (its intent committed); the next
    cycle finds the intent without a result and fails the task closed. Returns the key."""
    store.enqueue(WorkflowTask.new("outcome-flow", 1, "charge", checkpoint_id="pay-1"))
    crashed = subprocess.run(
        [sys.executable, "-m", "runifold_sync", "run", "--app", APP, "--database", url, "--once"],
        cwd=ROOT,
        env=os.environ | {"RUNIFOLD_CRASH_AT": "before_effect:charge#1"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert crashed.returncode == -9, crashed.stderr
    store.set_clock_offset(timedelta(seconds=31))  # past the dead worker's 30 s lease
    code, out = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    failed = json.loads(out)
    assert (code, failed["outcome"], failed["recoverable"]) == (1, "failed", True)
    record = store.get_task("pay-1")
    assert record.ambiguous_effect is not None
    return record.ambiguous_effect


def test_resolve_applied_requeues_the_task_and_it_completes_with_the_given_result(
    url: str, store: SqliteWorkflowStore
) -> None:
    key = _fail_on_ambiguous_charge(url, store)
    who = ("--actor", "ops", "--reason", "found the charge in the PSP dashboard", "--database", url)
    code, out = _invoke("resolve", "pay-1", key, "--applied", "--result", '"ch-from-psp"', *who, "--json")
    assert (code, json.loads(out)) == (
        0,
        {"task_id": "pay-1", "effect_key": key, "applied": True, "state": "queued"},
    )
    code, out = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    completed = {"outcome": "completed", "task_id": "pay-1", "result": "ch-from-psp"}
    assert (code, json.loads(out)) == (0, completed)


def test_the_failure_reason_names_the_resolve_command_and_that_command_resolves_the_effect(
    url: str, store: SqliteWorkflowStore
) -> None:
    key = _fail_on_ambiguous_charge(url, store)
    reason = store.get_task("pay-1").reason
    assert reason is not None
    shown = re.search(
        r"resolve it with resolve_effect or on the command line: python -m runifold_sync (.*)", reason
    )
    assert shown is not None, reason
    command = shown.group(1)
    assert command == (
        f"resolve pay-1 '{key}' (--applied [--result JSON] | --not-applied) --actor WHO --reason WHY"
    )
    arguments = shlex.split(command.split(" (")[0])  # what the reason names, as the shell reads it
    who = ("--actor", "ops", "--reason", "no charge at the PSP", "--database", url)
    code, out = _invoke(*arguments, "--not-applied", *who)
    assert (code, out) == (0, f"pay-1: effect {key} resolved as not applied; requeued\n")


def test_resolve_not_applied_requeues_the_task_and_the_effect_runs_again(
    url: str, store: SqliteWorkflowStore
) -> None:
    key = _fail_on_ambiguous_charge(url, store)
    who = ("--actor", "ops", "--reason", "no charge at the PSP", "--database", url)
    code, out = _invoke("resolve", "pay-1", key, "--not-applied", *who)
    assert (code, out) == (0, f"pay-1: effect {key} resolved as not applied; requeued\n")
    code, out = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    assert (code, json.loads(out)["result"]) == (0, "ch-from-body")
    record = store.get_task("pay-1")
    assert (record.state, record.outcome) == (TaskState.TERMINAL, TaskOutcome.COMPLETED)
    assert "effect_resolved" in [e.kind for e in store.history("pay-1")]


def test_list_definition_filter_shows_only_that_workflow(url: str, store: SqliteWorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("outcome-flow", 1, "complete", checkpoint_id="a"))
    store.enqueue(WorkflowTask.new("billing", 1, None, checkpoint_id="b"))
    store.enqueue(WorkflowTask.new("outcome-flow", 2, "complete", checkpoint_id="c"))
    code, out = _invoke("list", "--definition", "outcome-flow", "--database", url, "--json")
    assert code == 0 and [t["task_id"] for t in json.loads(out)] == ["a", "c"]
    code, out = _invoke("list", "--definition", "billing", "--database", url)
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["task", "b"]


def test_show_text_gives_state_reason_journal_usage_and_history(url: str, store: SqliteWorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("outcome-flow", 1, "suspend", checkpoint_id="s1"))
    assert _invoke("run", "--app", APP, "--database", url, "--once")[0] == 0
    code, out = _invoke("show", "s1", "--database", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "task s1: outcome-flow v1 (default)"
    assert lines[1] == "state: waiting"
    assert lines[2].startswith("reason: waiting for timer timer#1 until ")
    usage = re.fullmatch(
        r"revision 1, fencing token 1, usage "
        r"\{'steps': 1, 'cost': 0\.0, 'elapsed_s': ([0-9.]+), 'claims': 1\}",
        lines[3],
    )
    assert usage is not None, lines[3]
    assert 0 <= float(usage.group(1)) < 60  # run time of one short claim
    assert lines[4:7] == [
        "run 1, journal of 2 entries, all shown:",
        "  done#1 (step, done)",
        "  timer#1 (timer, pending)",
    ]
    history = lines[lines.index("history:") + 1 :]
    assert [h.split()[1] for h in history] == ["enqueued", "claimed", "suspended"]


def test_show_pages_a_long_journal_to_its_newest_entries(url: str, store: SqliteWorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("outcome-flow", 1, "suspend", checkpoint_id="s1"))
    assert _invoke("run", "--app", APP, "--database", url, "--once")[0] == 0
    code, out = _invoke("show", "s1", "--journal-limit", "1", "--database", url)
    assert code == 0
    lines = out.splitlines()
    assert lines[4:6] == [
        "run 1, journal of 2 entries, the newest 1 shown (--journal-limit):",
        "  timer#1 (timer, pending)",
    ]
    code, out = _invoke("show", "s1", "--journal-limit", "1", "--database", url, "--json")
    shown = json.loads(out)
    assert (shown["run"], shown["journal_entries"], shown["journal"]) == (
        1,
        2,
        [{"id": "timer#1", "kind": "timer", "status": "pending"}],
    )
    code, out = _invoke("show", "s1", "--journal-limit", "0", "--database", url)
    assert code == 2 and "--journal-limit" in out


def test_show_counts_the_signals_refused_past_those_its_history_records(
    url: str, store: SqliteWorkflowStore
) -> None:
    store.enqueue(WorkflowTask.new("outcome-flow", 1, "suspend", checkpoint_id="done-1"))
    store.cancel("done-1", "ops", "not needed")
    for n in range(25):  # a finished task refuses every signal
        with pytest.raises(SignalRefused):
            store.send_signal("done-1", "go", n, signal_id=f"late-{n}", sender="bot")
    code, out = _invoke("show", "done-1", "--database", url)
    assert code == 0
    assert "25 signals refused when sent: the history shows the first 20, the rest are counted" in out
    history = out.splitlines()[out.splitlines().index("history:") + 1 :]
    assert [h.split()[1] for h in history].count("signal_refused") == 20
    code, out = _invoke("show", "done-1", "--database", url, "--json")
    assert code == 0 and json.loads(out)["refused_signals"] == 25
