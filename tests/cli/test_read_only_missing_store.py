"""A command that only reads refuses a SQLite file that does not exist, naming it and
saying what creates one, and leaves no file behind: a mistyped path used to answer
"no tasks", exit 0, and leave a new empty store there."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync.cli.main import main
from runifold_sync.store.open import ENV_VAR

READERS = {
    "list": ["list"],
    "show": ["show", "t1"],
    "stats": ["stats"],
    "workers": ["workers"],
    "versions": ["versions"],
    "schedules": ["schedules"],
    "schedule history": ["schedule", "history", "nightly"],
    "tenant list": ["tenant", "list"],
    "wait": ["wait", "t1", "--timeout", "0s"],
    "dashboard": ["dashboard"],
}


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("command", list(READERS))
def test_a_reader_refuses_a_sqlite_file_that_does_not_exist(tmp_path: Path, command: str) -> None:
    typo = tmp_path / "typo.db"
    args = [*READERS[command], "--database", f"sqlite:///{typo}"]
    taken = socket.create_server(("127.0.0.1", 0))  # were the store opened, the dashboard fails, not serves
    if command == "dashboard":
        args += ["--port", str(taken.getsockname()[1])]
    message = (
        f"no SQLite store at {typo}: this command only reads a store, so it does not create one; "
        "check the path, or create the store with `migrate` (or `run`)"
    )
    result = _invoke(*args)
    assert (result.exit_code, result.stdout, result.stderr) == (1, "", f"Error: {message}\n")
    result = _invoke(*args, "--json")
    assert result.exit_code == 1
    assert json.loads(result.stdout) == {"error": message, "type": "InvalidArgument"}
    assert list(tmp_path.iterdir()) == []  # no store file, no -wal or -shm
    taken.close()


def test_the_default_store_missing_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    result = _invoke("list")
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: no --database and no ${ENV_VAR}, and no SQLite store at "
        f"{tmp_path / 'runifold-workflows.db'}: "
        "this command only reads a store, so it does not create one; check the path, or create the "
        "store with `migrate` (or `run`)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_once_migrate_has_made_the_store_the_readers_read_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    assert _invoke("migrate", "--database", url).exit_code == 0
    listed = _invoke("list", "--database", url)
    assert (listed.exit_code, listed.stdout) == (0, "no tasks\n")
    assert _invoke("stats", "--database", url).exit_code == 0
