"""The command line through CliRunner and as real subprocesses (the cron mode)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from runifold_sync import LeaseDuration, WorkerId
from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.pool.pool_app:registry"


@pytest.fixture
def url(sqlite_path: Path) -> str:
    return f"sqlite:///{sqlite_path}"


@pytest.fixture(autouse=True)
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.txt"
    monkeypatch.setenv("POOL_LEDGER", str(path))
    return path


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def _invoke_json(*args: str) -> tuple[int, object]:
    """A ``--json`` command's exit code and its standard output decoded (warnings go to
    standard error)."""
    result = CliRunner().invoke(main, [*args, "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


def _commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = []
    for name, command in group.commands.items():
        found.append(((*prefix, name), command))
        if isinstance(command, click.Group):
            found += _commands(command, (*prefix, name))
    return found


def test_every_command_has_help_text() -> None:
    assert isinstance(main, click.Group)
    commands = _commands(main)
    assert ("tenant", "set") in [path for path, _ in commands]
    for path, command in commands:
        assert command.help, f"command {' '.join(path)} has no help text"
        code, output = _invoke(*path, "--help")
        assert code == 0 and command.help.split()[0] in output
        for param in command.params:
            if isinstance(param, click.Option):
                assert param.help, f"option {param.name} of {' '.join(path)} has no help text"


def test_enqueue_is_idempotent_on_checkpoint_id_and_reports_it(url: str) -> None:
    args = ("enqueue", "pool-flow", "1", "--input", "5", "--checkpoint-id", "c1", "--database", url)
    assert _invoke_json(*args) == (0, {"task_id": "c1", "created": True, "not_before": None})
    assert _invoke_json(*args) == (0, {"task_id": "c1", "created": False, "not_before": None})
    assert _invoke_json(*args, "--app", APP) == (
        0,
        {"task_id": "c1", "created": False, "not_before": None},
    )  # the same task
    code, out = _invoke(
        "enqueue", "pool-flow", "1", "--input", "6", "--checkpoint-id", "c1", "--database", url
    )
    assert code == 1 and "different input" in out


def test_enqueue_with_bad_input_names_the_problem(url: str) -> None:
    code, out = _invoke("enqueue", "pool-flow", "0", "--database", url)
    assert code == 1 and "version must be an integer in 1..9223372036854775807, got 0" in out
    code, out = _invoke("enqueue", "pool-flow", "1", "--input", "{nope", "--database", url)
    assert code == 2 and "not JSON" in out


def test_run_once_completes_a_task_and_show_prints_its_history(url: str) -> None:
    _invoke("enqueue", "pool-flow", "1", "--input", "1", "--checkpoint-id", "t1", "--database", url)
    code, out = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    assert code == 0
    assert json.loads(out) == {"outcome": "completed", "task_id": "t1", "result": 6}
    code, out = _invoke("show", "t1", "--database", url, "--json")
    shown = json.loads(out)
    assert shown["state"] == "terminal" and shown["outcome"] == "completed" and shown["result"] == 6
    assert [e["kind"] for e in shown["history"]] == ["enqueued", "claimed", "completed"]
    assert len(shown["journal"]) == 5


def test_run_once_leaves_a_version_it_lacks_alone_and_list_says_no_worker_serves_it(url: str) -> None:
    _invoke("enqueue", "unknown-flow", "3", "--checkpoint-id", "u1", "--database", url)
    code, out = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    assert code == 0 and json.loads(out)["outcome"] == "idle"
    code, out = _invoke("list", "--database", url, "--json")
    [listed] = json.loads(out)
    assert listed["state"] == "queued" and listed["queue"] == "default"
    assert listed["status_note"].startswith("ready since")  # no worker is live: the fleet is down
    assert listed["status_note"].endswith(": no worker is live")
    code, out = _invoke("list", "--database", url)
    assert code == 0 and out.rstrip().endswith(": no worker is live")
    code, out = _invoke("show", "u1", "--database", url)
    assert code == 0 and "status: ready since " in out and ": no worker is live" in out


def test_run_refuses_a_heartbeat_longer_than_half_the_lease(url: str) -> None:
    code, out = _invoke("run", "--app", APP, "--database", url, "--lease", "10", "--heartbeat", "6")
    assert code == 1 and "at most half the lease" in out


def test_run_refuses_an_app_reference_that_is_not_a_registry(url: str) -> None:
    code, out = _invoke("run", "--app", "tests.pool.pool_app:STEPS", "--database", url, "--once")
    assert code == 2 and "is not an App or a WorkflowRegistry" in out  # a usage error, as every bad --app
    code, out = _invoke("run", "--app", "no_such_module_x:registry", "--database", url, "--once")
    assert code == 2 and "cannot import 'no_such_module_x'" in out


def test_show_of_unknown_task_fails_with_its_id(url: str) -> None:
    _invoke("migrate", "--database", url)
    code, out = _invoke("show", "missing-task", "--database", url)
    assert code == 1 and "no task with id 'missing-task'" in out


def test_resolve_refuses_a_task_that_is_not_failed_on_that_effect(url: str) -> None:
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "r1", "--database", url)
    code, out = _invoke(
        "resolve", "r1", "r1/x#1", "--applied", "--actor", "ops", "--reason", "checked", "--database", url
    )
    assert code == 1 and "only a task failed on ambiguous effect" in out


def test_migrate_reports_the_schema_version(url: str) -> None:
    code, out = _invoke("migrate", "--database", url)
    assert code == 0 and out.startswith("schema version ")


def test_unknown_store_url_scheme_is_refused(tmp_path: Path) -> None:
    code, out = _invoke("migrate", "--database", "mysql://localhost/x")
    assert code == 1 and "unsupported store URL 'mysql://localhost/x'" in out


def test_list_filters_by_state_and_prints_json(url: str) -> None:
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "l1", "--database", url)
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "l2", "--tenant", "globex", "--database", url)
    code, out = _invoke("list", "--tenant", "globex", "--database", url, "--json")
    assert code == 0 and [t["task_id"] for t in json.loads(out)] == ["l2"]
    _invoke("cancel", "l2", "--actor", "ops", "--reason", "duplicate order", "--database", url)
    code, out = _invoke("list", "--state", "queued", "--database", url, "--json")
    assert code == 0 and [t["task_id"] for t in json.loads(out)] == ["l1"]
    code, out = _invoke("list", "--state", "cancelled", "--database", url)
    assert code == 0 and [line.split()[0] for line in out.splitlines()] == ["task", "l2"]


def test_versions_preflight_exits_non_zero_when_the_app_lacks_a_referenced_version(url: str) -> None:
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "v1", "--database", url)
    code, out = _invoke("versions", "--app", APP, "--database", url, "--json")
    assert code == 0 and json.loads(out)["missing"] == []
    _invoke("enqueue", "pool-flow", "2", "--checkpoint-id", "v2", "--database", url)
    code, out = _invoke("versions", "--app", APP, "--database", url)
    assert code == 1 and "pool-flow v2: 1 queued" in out and "MISSING from app" in out
    code, out = _invoke("versions", "--database", url)  # without --app it only lists
    assert code == 0 and "pool-flow v1" in out


def test_versions_preflight_fails_on_a_version_only_a_waiting_task_references(url: str) -> None:
    """A task asleep on a timer or a signal resumes on the version it started with, so the
    app must still carry that version even when no task of it is queued or leased."""
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "v1", "--database", url)
    _invoke("enqueue", "pool-flow", "2", "--checkpoint-id", "v2", "--database", url)
    store = SqliteWorkflowStore.open(url.removeprefix("sqlite:///"))
    for claimed in store.claim(WorkerId.parse("w-0"), LeaseDuration(timedelta(seconds=30)), limit=2):
        if claimed.lease.task_id == "v2":
            store.suspend(claimed.lease, claimed.revision, "{}", wake_at=None, reason="approval", signal="go")
        else:
            store.release(claimed.lease, delay=timedelta(0), reason="back")
    store.close()
    code, out = _invoke("versions", "--app", APP, "--database", url)
    assert code == 1
    assert (
        "pool-flow v2: 0 queued, 0 leased, 1 waiting, 0 recoverable; "
        "served by 0 live worker(s)  MISSING from app" in out
    )
    assert "pool-flow v1: 1 queued, 0 leased, 0 waiting, 0 recoverable; served by 0 live worker(s)\n" in out
    code, out = _invoke("versions", "--app", APP, "--database", url, "--json")
    assert code == 1 and json.loads(out)["missing"] == [{"name": "pool-flow", "version": 2}]


def test_stats_json_reports_queues_tenant_holds_and_unserved_versions(url: str) -> None:
    for n in range(3):
        _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", f"s{n}", "--database", url)
    _invoke("enqueue", "pool-flow", "2", "--checkpoint-id", "v2", "--tenant", "acme", "--database", url)
    store = SqliteWorkflowStore.open(url.removeprefix("sqlite:///"))
    store.register_worker(WorkerId.parse("host-a-0"), host="host-a", pid=11, definitions=[("pool-flow", 1)])
    store.close()
    code, out = _invoke("tenant", "set", "acme", "--max-leased", "0", "--database", url)
    assert code == 0 and "tenant acme: 0 leased of 0" in out
    code, out = _invoke("stats", "--database", url, "--json")
    report = json.loads(out)
    assert code == 0 and set(report) == {"queues", "tenants", "flow", "unserved", "unserved_routes"}
    queues = {(q["tenant"], q["state"]): q for q in report["queues"]}
    assert queues[("default", "queued")]["count"] == 3
    assert queues[("default", "queued")]["oldest_ready_age_s"] >= 0
    assert queues[("acme", "queued")]["count"] == 1
    (acme,) = report["tenants"]
    assert (acme["tenant"], acme["max_leased"], acme["leased"], acme["ready"], acme["held"]) == (
        "acme",
        0,
        0,
        1,
        1,
    )
    assert acme["hold_reason"].startswith("queued behind tenant limit")
    assert report["unserved"] == [{"name": "pool-flow", "version": 2, "tasks": 1}]
    assert report["unserved_routes"] == [
        {
            "queue": "default",
            "definition": "pool-flow",
            "version": 2,
            "fingerprint": None,
            "tasks": 1,
            "reason": "no live worker serves 'pool-flow' version 2 in queue 'default'",
        }
    ]
    code, out = _invoke("stats", "--database", url)
    assert code == 0 and "UNSERVED: pool-flow v2 (1 tasks)" in out
    assert (
        "UNSERVED: queue default, pool-flow v2 (1 tasks): no live worker serves 'pool-flow' version 2" in out
    )


def test_tenant_set_and_list_show_a_policy_and_show_explains_a_held_task(url: str) -> None:
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "b1", "--tenant", "acme", "--database", url)
    code, out = _invoke("tenant", "set", "acme", "--budget", "0", "--budget-window", "60", "--database", url)
    assert code == 0 and "charged 0 of 0 per 0:01:00" in out
    code, out = _invoke("tenant", "list", "--database", url, "--json")
    (acme,) = json.loads(out)
    assert (acme["budget_cost"], acme["budget_window_s"], acme["held"]) == (0.0, 60.0, 1)
    code, out = _invoke("show", "b1", "--database", url, "--json")
    shown = json.loads(out)
    assert shown["status_note"].startswith("deferred by budget admission: tenant 'acme'")
    assert shown["reason"] is None  # what the store recorded, apart from the derived note
    code, out = _invoke("list", "--database", url)
    assert "deferred by budget admission" in out
    code, out = _invoke("tenant", "set", "acme", "--database", url)
    assert code == 0 and "no limits" in out
    code, out = _invoke("tenant", "list", "--database", url)
    assert "every tenant is unlimited" in out
    code, out = _invoke("tenant", "set", "acme", "--budget-window", "60", "--database", url)
    assert code == 2 and "--budget-window needs --budget" in out
    code, out = _invoke("tenant", "set", " bad", "--database", url)
    assert code != 0 and "tenant must be non-empty without surrounding spaces" in out


def test_retry_requeues_a_failed_task_and_it_then_completes(
    url: str, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _invoke("enqueue", "pool-flow", "1", "--input", "0", "--checkpoint-id", "f1", "--database", url)
    store = SqliteWorkflowStore.open(url.removeprefix("sqlite:///"))
    monkeypatch.delenv("POOL_LEDGER")  # the step fails without its ledger
    for attempt in range(1, 4):  # the default retry policy allows three attempts
        _invoke("run", "--app", APP, "--database", url, "--once")
        store.set_clock_offset(timedelta(minutes=10 * attempt))  # past each backoff
    assert store.get_task("f1").outcome is TaskOutcome.FAILED
    code, out = _invoke("retry", "f1", "--actor", "ops", "--reason", "ledger restored", "--database", url)
    assert code == 0 and "requeued" in out
    monkeypatch.setenv("POOL_LEDGER", str(ledger))
    code, out = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    assert code == 0 and json.loads(out)["result"] == 5
    assert store.history("f1")[-3].kind == "requeued"
    store.close()


def test_workers_lists_registered_workers_and_versions_counts_live_servers(url: str) -> None:
    store = SqliteWorkflowStore.open(url.removeprefix("sqlite:///"))
    store.register_worker(WorkerId.parse("host-a-0"), host="host-a", pid=11, definitions=[("pool-flow", 1)])
    store.register_worker(WorkerId.parse("host-b-0"), host="host-b", pid=12, definitions=[("pool-flow", 2)])
    store.worker_stopped(WorkerId.parse("host-b-0"), 12)
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "a", "--database", url)
    _invoke("enqueue", "pool-flow", "2", "--checkpoint-id", "b", "--database", url)
    code, out = _invoke("workers", "--database", url, "--json")
    listed = {w["worker_id"]: w["live"] for w in json.loads(out)}
    assert code == 0 and listed == {"host-a-0": True, "host-b-0": False}
    code, out = _invoke("versions", "--database", url, "--json")
    report = json.loads(out)
    assert [(r["version"], r["live_workers"]) for r in report["referenced"]] == [(1, 1), (2, 0)]
    assert report["unserved"] == [{"name": "pool-flow", "version": 2, "tasks": 1}]
    store.close()


def test_enqueue_reads_its_input_from_a_file_or_standard_input(url: str, tmp_path: Path) -> None:
    """An input past what a command line holds (about 128 KB) is enqueued from a file."""
    big = {"lines": ["x" * 1000] * 300}  # about 300 KB of JSON
    source = tmp_path / "input.json"
    source.write_text(json.dumps(big))
    enqueued = _invoke_json(
        "enqueue", "pool-flow", "1", "--input", f"@{source}", "--checkpoint-id", "f1", "--database", url
    )
    assert enqueued == (0, {"task_id": "f1", "created": True, "not_before": None})
    result = CliRunner().invoke(
        main,
        ["enqueue", "pool-flow", "1", "--input", "-", "--checkpoint-id", "s1", "--database", url],
        input="[1, 2]",
    )
    assert result.exit_code == 0, result.output
    with SqliteWorkflowStore.open(url.removeprefix("sqlite:///")) as store:
        assert store.get_task("f1").input == big
        assert store.get_task("s1").input == [1, 2]
    code, out = _invoke(
        "enqueue", "pool-flow", "1", "--input", f"@{tmp_path / 'missing.json'}", "--database", url
    )
    assert code == 2 and "cannot read" in out and "No such file or directory" in out


def test_stats_and_list_on_an_empty_store_say_there_are_no_tasks(url: str) -> None:
    _invoke("migrate", "--database", url)
    assert _invoke("stats", "--database", url) == (0, "no tasks\n")
    assert _invoke("list", "--database", url) == (0, "no tasks\n")
    assert _invoke("list", "--tenant", "acme", "--database", url) == (0, "no tasks match these filters\n")
    assert _invoke_json("list", "--database", url) == (0, [])  # --json unchanged
    code, report = _invoke_json("stats", "--database", url)
    assert code == 0 and report == {
        "queues": [],
        "tenants": [],
        "flow": [],
        "unserved": [],
        "unserved_routes": [],
    }


def test_list_prints_a_header_row_above_its_rows(url: str) -> None:
    _invoke("enqueue", "pool-flow", "1", "--checkpoint-id", "h1", "--tenant", "acme", "--database", url)
    code, out = _invoke("list", "--database", url)
    header, row = out.splitlines()
    assert code == 0 and header.split()[:4] == ["task", "definition", "tenant", "state"]
    assert row.split()[:5] == ["h1", "pool-flow", "v1", "acme", "queued"]
    assert row.index("acme") == header.index("tenant") and row.index("queued") == header.index("state")
    code, out = _invoke("stats", "--database", url)
    assert code == 0 and "no tasks" not in out and out.split()[:3] == ["acme", "queued", "1"]
