"""``open_store(url)``: the URL forms, the environment default and the refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from runifold_sync import WorkflowTask, open_store
from runifold_sync.errors import InvalidArgument
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.open import ENV_VAR, sqlite_path
from runifold_sync.store.queries import load_migrations
from tests.support import processes
from tests.support.backends import through_pgbouncer


def test_three_slashes_name_a_sqlite_file_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    with open_store("sqlite:///data/work.db") as store:
        assert isinstance(store, SqliteWorkflowStore)
        store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
    assert (tmp_path / "data" / "work.db").exists()


def test_four_slashes_name_an_absolute_sqlite_path(tmp_path: Path) -> None:
    target = tmp_path / "abs.db"
    with open_store(f"sqlite:///{target}") as store:
        assert isinstance(store, SqliteWorkflowStore)
        assert store.path == str(target)
    assert target.exists()
    assert sqlite_path("sqlite:////var/lib/runifold/w.db") == "/var/lib/runifold/w.db"
    assert sqlite_path("sqlite:///w%20x.db") == "w x.db"


def test_without_a_url_the_environment_variable_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, f"sqlite:///{tmp_path / 'from-env.db'}")
    with open_store() as store:
        assert isinstance(store, SqliteWorkflowStore)
    assert (tmp_path / "from-env.db").exists()


def test_without_url_or_environment_a_local_sqlite_file_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    with open_store() as store:
        assert isinstance(store, SqliteWorkflowStore)
    assert (tmp_path / "runifold-workflows.db").exists()


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_postgresql_urls_open_the_postgres_store(postgres_url: str, scheme: str) -> None:
    url = scheme + postgres_url[postgres_url.index(":") :]
    with open_store(url) as store:
        assert isinstance(store, PostgresWorkflowStore)
        store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1"))
        assert store.get_task("t1").task_id == "t1"


@pytest.mark.parametrize(
    "url",
    ["mysql://db/x", "sqlite.db", "http://example.com/db", "", "sqlite:/relative.db", "redis://localhost"],
)
def test_an_unsupported_url_is_refused_naming_it(url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        open_store(url)
    assert repr(url) in str(info.value) or url in str(info.value)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite://host/x.db", "sqlite:///x.db?mode=ro"])
def test_a_malformed_sqlite_url_is_refused(url: str) -> None:
    with pytest.raises(InvalidArgument, match="SQLite URL"):
        open_store(url)


def test_a_refused_url_does_not_echo_its_password() -> None:
    with pytest.raises(InvalidArgument) as info:
        open_store("mysql://admin:hunter2@db.internal/app")
    assert "hunter2" not in str(info.value) and "db.internal" in str(info.value)


def test_a_postgresql_url_without_the_driver_installed_names_the_extra_but_not_the_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "runifold_sync.store.postgres.store", None)  # as if psycopg were absent
    with pytest.raises(InvalidArgument) as info:
        open_store("postgresql://admin:hunter2@db.internal/app")
    assert "runifold_sync[postgres]" in str(info.value)
    assert "hunter2" not in str(info.value) and "db.internal" in str(info.value)


def _cli(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``python -m runifold_sync ARGS`` in ``cwd`` with exactly the given runifold
    environment (no inherited ``RUNIFOLD_DATABASE_URL``)."""
    base = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    return processes.run("runifold_sync", *args, timeout_s=60, env=base | env, cwd=cwd)


@pytest.mark.timeout(90)
def test_the_migrate_command_with_a_postgresql_url_migrates_that_database(
    postgres_url: str, tmp_path: Path
) -> None:
    latest = load_migrations("postgres")[-1][0]
    done = _cli(tmp_path, "migrate", "--database", postgres_url, env={})
    assert (done.returncode, done.stdout) == (0, f"schema version {latest}\n"), done.stderr
    with psycopg.connect(postgres_url) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM runifold_schema ORDER BY version")]
    assert versions == list(range(1, latest + 1))
    assert list(tmp_path.iterdir()) == []  # no SQLite file was opened instead


@pytest.mark.timeout(90)
def test_the_environment_variable_alone_points_the_cli_at_postgresql(
    postgres_url: str, tmp_path: Path
) -> None:
    with open_store(postgres_url) as store:
        store.enqueue(WorkflowTask.new("orders", 1, {}, checkpoint_id="t1", tenant="acme"))
    done = _cli(tmp_path, "stats", "--json", env={ENV_VAR: postgres_url})
    assert done.returncode == 0, done.stderr
    queues = json.loads(done.stdout)["queues"]
    assert [(q["tenant"], q["state"], q["count"]) for q in queues] == [("acme", "queued", 1)]
    assert list(tmp_path.iterdir()) == []  # no SQLite file was opened instead


@pytest.mark.timeout(90)
def test_run_once_with_a_postgresql_url_runs_a_task_of_that_database(
    postgres_url: str, tmp_path: Path
) -> None:
    with open_store(postgres_url) as store:
        store.enqueue(WorkflowTask.new("outcome-flow", 1, "complete", checkpoint_id="t1"))
    app = "tests.cli.outcome_app:registry"
    done = _cli(tmp_path, "run", "--app", app, "--database", postgres_url, "--once", "--json", env={})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"outcome": "completed", "task_id": "t1", "result": "complete"}
    with open_store(postgres_url) as store:
        assert store.get_task("t1").state is TaskState.TERMINAL
    assert list(tmp_path.iterdir()) == []  # no SQLite file was opened instead


@pytest.mark.timeout(120)
@pytest.mark.parametrize("route", ["direct", "transaction", "session"])
def test_the_demo_runs_on_a_postgresql_url_and_every_order_completes(
    postgres_url: str, tmp_path: Path, route: str
) -> None:
    """Straight to the server and through PgBouncer in either pooling mode."""
    url = postgres_url if route == "direct" else through_pgbouncer(postgres_url, route)
    done = _cli(tmp_path, "demo", "--database", url, "--orders", "2", env={})
    assert done.returncode == 0, done.stdout + done.stderr
    with open_store(postgres_url) as store:
        tasks = store.list_tasks()
    assert len(tasks) == 2
    assert {(t.state, t.outcome) for t in tasks} == {(TaskState.TERMINAL, TaskOutcome.COMPLETED)}
    assert list(tmp_path.iterdir()) == []  # nothing written to the working directory


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://",
        "postgresql://postgres@127.0.0.1:5432",
        "postgresql://postgres:SECRETPW@127.0.0.1:5432/",
        "postgresql://postgres@127.0.0.1:5432/app?sslmode=bogus",
        "postgresql://postgres@127.0.0.1:99999/app",
        "postgresql://postgres@127.0.0.1:abc/app",
    ],
)
def test_a_postgresql_url_without_a_database_or_with_bad_options_is_refused_before_connecting(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a database name libpq would use the user's name, and opening migrates: a
    store in a database nobody named. Options libpq would refuse are the caller's mistake,
    not an outage. Neither reaches the server."""
    from runifold_sync.store.postgres import pool as pgpool

    def no_connection(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("connected")

    monkeypatch.setattr(pgpool.ProcessPool, "open", no_connection)
    with pytest.raises(InvalidArgument) as info:
        open_store(url)
    assert url.replace("SECRETPW", "***") in str(info.value) and "SECRETPW" not in str(info.value)


@pytest.mark.parametrize("how", ["url", "open"])
def test_an_in_memory_sqlite_database_is_refused(how: str) -> None:
    """Each thread's connection (the heartbeat's, a cycle's) would get its own empty
    database: a task whose step outlives a heartbeat would lose its lease every time."""
    with pytest.raises(InvalidArgument, match="needs a file") as info:
        if how == "url":
            open_store("sqlite:///:memory:")
        else:
            SqliteWorkflowStore.open(":memory:")
    assert "':memory:'" in str(info.value)
