"""``flow set``, ``flow remove`` and ``flow list`` from the command line, and the flow
groups in ``stats``: text, ``--json``, and refusals naming the option."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

from click.testing import CliRunner

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_a_limit_set_at_run_time_holds_the_next_claim_and_list_shows_the_group(sqlite_path: Path) -> None:
    url = f"sqlite:///{sqlite_path}"
    code, out = _invoke("flow", "set", "key", "acct-*", "--max-running", "1", "--database", url)
    assert (code, out) == (0, "set key 'acct-*' (max_running 1)\n")
    with SqliteWorkflowStore.open(str(sqlite_path)) as store:
        store.enqueue_many(
            [WorkflowTask.new("o", 1, n, checkpoint_id=f"t{n}", concurrency_key="acct-1") for n in range(3)]
        )
        claimed = store.claim(WorkerId.parse("w"), LeaseDuration(timedelta(seconds=30)), limit=5)
        assert [c.lease.task_id for c in claimed] == ["t0"]
    code, out = _invoke("flow", "list", "--database", url)
    assert code == 0 and "key acct-1: running 1/1, waiting 2  HELD: held by the concurrency limit" in out
    code, out = _invoke("flow", "list", "--json", "--database", url)
    (group,) = json.loads(out)["groups"]
    assert (group["group"], group["running"], group["waiting"]) == ("acct-1", 1, 2)
    code, out = _invoke("stats", "--json", "--database", url)
    assert [g["group"] for g in json.loads(out)["flow"]] == ["acct-1"]
    code, out = _invoke("flow", "remove", "key", "acct-*", "--json", "--database", url)
    assert json.loads(out) == {"scope": "key", "target": "acct-*", "removed": True}


def test_flow_set_refuses_bad_values_naming_them(sqlite_path: Path) -> None:
    url = f"sqlite:///{sqlite_path}"
    code, out = _invoke("flow", "set", "key", "k", "--database", url)
    assert code != 0 and "needs max_running or rate" in out
    code, out = _invoke("flow", "set", "key", "k", "--max-running", "-1", "--database", url)
    assert code != 0 and "max_running" in out
    code, out = _invoke("flow", "set", "key", "k", "--max-running", "1", "--per", "2", "--database", url)
    assert code != 0 and "--per needs --rate" in out
    code, out = _invoke("flow", "set", "tenant", "k", "--max-running", "1", "--database", url)
    assert code != 0 and "tenant" in out


def test_flow_age_raises_long_ready_tasks(sqlite_path: Path) -> None:
    url = f"sqlite:///{sqlite_path}"
    with SqliteWorkflowStore.open(str(sqlite_path)) as store:
        store.enqueue(WorkflowTask.new("o", 1, 0, checkpoint_id="old", priority=1))
        store.set_clock_offset(timedelta(seconds=25))
    code, out = _invoke("flow", "age", "--waited", "10", "--up-to", "9", "--json", "--database", url)
    assert (code, json.loads(out)) == (0, {"raised": 1})
    with SqliteWorkflowStore.open(str(sqlite_path)) as store:
        assert store.get_task("old").priority == 3  # 1, and a level per 10 s of the 25
    code, out = _invoke("flow", "age", "--waited", "0", "--up-to", "9", "--database", url)
    assert code != 0 and "--waited" in out
