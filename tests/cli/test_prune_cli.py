"""``prune`` through the CLI (durations, dry run, JSON, the ambiguous rule, progress on
stderr) and ``run --retention``: a real pool whose retention process deletes the tasks
it finished once they age, while it goes on working."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import attrs
import pytest
from click.testing import CliRunner, Result

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.errors import TaskNotFound
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskState
from tests.support import processes

APP = "tests.pool.pool_app:registry"
LEASE = LeaseDuration(timedelta(seconds=30))


@pytest.fixture
def store(sqlite_path: Path) -> Iterator[SqliteWorkflowStore]:
    opened = SqliteWorkflowStore.open(sqlite_path)
    yield opened
    opened.close()


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _finish(store: SqliteWorkflowStore, task_id: str, *, ambiguous: bool = False) -> None:
    store.enqueue(WorkflowTask.new("pool-flow", 1, 0, checkpoint_id=task_id))
    [claimed] = store.claim(WorkerId.parse("w1"), LEASE)
    if ambiguous:
        store.fail(claimed.lease, claimed.revision, "{}", reason="unknown", ambiguous_effect="charge#1")
    else:
        store.complete(claimed.lease, claimed.revision, "{}", "1")


def _stored(store: SqliteWorkflowStore, task_id: str) -> bool:
    try:
        store.get_task(task_id)
    except TaskNotFound:
        return False
    return True


def test_prune_counts_with_dry_run_then_deletes_and_says_so(
    store: SqliteWorkflowStore, sqlite_path: Path
) -> None:
    url = f"sqlite:///{sqlite_path}"
    for n in range(3):
        _finish(store, f"t{n}")
    _finish(store, "unsure", ambiguous=True)
    store.set_clock_offset(timedelta(days=31))

    dry = _invoke("prune", "--older-than", "30d", "--dry-run", "--json", "--database", url)
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.stdout) == {
        "pruned": 3,
        "dry_run": True,
        "older_than_s": 30 * 86400.0,
        "include_ambiguous": False,
        "batches": 1,
    }
    assert all(_stored(store, f"t{n}") for n in range(3))

    done = _invoke("prune", "--older-than", "720h", "--batch", "2", "--database", url)
    assert done.exit_code == 0, done.output
    assert done.stdout == "pruned 3 finished tasks last changed more than 30d ago\n"
    assert not any(_stored(store, f"t{n}") for n in range(3))
    assert _stored(store, "unsure")

    taken = _invoke("prune", "--older-than", "43200m", "--include-ambiguous", "--json", "--database", url)
    assert json.loads(taken.stdout)["pruned"] == 1
    assert not _stored(store, "unsure")


def test_a_long_prune_says_how_far_it_has_got_on_stderr(
    store: SqliteWorkflowStore, sqlite_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("runifold_sync.cli.retention._PROGRESS_EVERY_S", 0.0)
    for n in range(3):
        _finish(store, f"t{n}")

    result = _invoke("prune", "--older-than", "0s", "--batch", "1", "--database", f"sqlite:///{sqlite_path}")

    assert result.exit_code == 0, result.output
    progress = result.stderr.splitlines()
    assert [line.split(" (")[0] for line in progress] == [f"pruned {n} tasks so far" for n in (1, 2, 3, 3)]
    assert result.stdout.startswith("pruned 3 finished tasks")


@pytest.mark.parametrize("given", ["30", "30 days", "-1d", "d"])
def test_prune_refuses_what_is_not_a_duration(sqlite_path: Path, given: str) -> None:
    result = _invoke("prune", "--older-than", given, "--database", f"sqlite:///{sqlite_path}")
    assert result.exit_code == 2
    assert f"Invalid value for '--older-than': {given!r} is not a duration" in result.stderr


def test_run_refuses_retention_with_once(sqlite_path: Path) -> None:
    result = _invoke(
        "run", "--app", APP, "--database", f"sqlite:///{sqlite_path}", "--once", "--retention", "1d"
    )
    assert result.exit_code == 2
    assert "--retention prunes beside a running pool and cannot be used with --once" in result.stderr


@pytest.mark.timeout(120)
def test_run_with_retention_prunes_what_the_pool_finished_once_it_ages(
    store: SqliteWorkflowStore, sqlite_path: Path, tmp_path: Path
) -> None:
    first = [f"a{n}" for n in range(6)]
    for n, task_id in enumerate(first):
        store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
    command = ["run", "--app", APP, "--database", f"sqlite:///{sqlite_path}", "--concurrency", "2"]
    command += ["--retention", "3s", "--json"]
    env = os.environ | {"POOL_LEDGER": str(tmp_path / "ledger.txt")}
    errors = (tmp_path / "pool.err").open("w")
    proc = processes.spawn("runifold_sync", *command, env=env, stderr=errors, own_session=True)
    try:
        processes.wait_until(lambda: not any(_stored(store, t) for t in first), 60, "the first tasks pruned")
        later = [f"b{n}" for n in range(4)]
        for n, task_id in enumerate(later):
            store.enqueue(WorkflowTask.new("pool-flow", 1, n, checkpoint_id=task_id))
        processes.wait_until(
            lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in later), 60, "the later tasks"
        )
        assert [store.get_task(t).result for t in later] == [n + 5 for n in range(4)]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        processes.kill(proc)
        errors.close()
    logged = (tmp_path / "pool.err").read_text()
    assert proc.returncode == 0, logged
    assert json.loads(out)["outcomes"]["completed"] == 10
    assert re.search(r"retention stopped; ([6-9]|10) tasks pruned", logged), logged
    assert "Traceback" not in logged, logged


def test_show_names_a_parent_that_was_pruned_before_its_child(
    store: SqliteWorkflowStore, sqlite_path: Path
) -> None:
    url = f"sqlite:///{sqlite_path}"
    _finish(store, "parent")
    store.set_clock_offset(timedelta(days=31))
    store.enqueue(
        attrs.evolve(WorkflowTask.new("pool-flow", 1, 0, checkpoint_id="child"), parent_id="parent")
    )
    store.cancel("child", "ops", "not needed")
    assert store.prune(timedelta(days=30)) == 1  # the parent; its child ended just now

    shown = _invoke("show", "child", "--database", url)
    as_json = _invoke("show", "child", "--json", "--database", url)

    assert shown.exit_code == 0, shown.output
    assert "parent: parent (no longer stored: pruned)" in shown.stdout
    assert (json.loads(as_json.stdout)["parent"], json.loads(as_json.stdout)["parent_task"]) == (
        "parent",
        None,
    )
