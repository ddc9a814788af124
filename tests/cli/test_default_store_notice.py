"""A command given no store (no ``--database``, no ``$RUNIFOLD_DATABASE_URL``) says on
stderr which file it uses, and whether it creates it; stdout stays the command's own, and
naming the store either way silences the line. Before, it silently created
``./runifold-workflows.db`` and enqueued into it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync.cli.main import main
from runifold_sync.store.open import ENV_VAR

APP = "tests.pool.pool_app:registry"
NOTICE = "runifold_sync: no --database and no $RUNIFOLD_DATABASE_URL: {doing} the SQLite store {path} "
NOTICE_END = "(name a store with either to silence this)"


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory of its own, with no store named in the environment."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
    return tmp_path


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_the_default_store_is_named_on_stderr_when_created_and_when_used(elsewhere: Path) -> None:
    path = elsewhere / "runifold-workflows.db"
    created = _invoke(
        "enqueue", "pool-flow", "1", "--input", "1", "--checkpoint-id", "t1", "--app", APP, "--json"
    )
    assert created.exit_code == 0, created.output
    assert created.stderr == NOTICE.format(doing="creating", path=path) + NOTICE_END + "\n"
    assert json.loads(created.stdout)["task_id"] == "t1"  # --json output untouched
    assert path.exists()

    listed = _invoke("list", "--json")
    assert listed.exit_code == 0
    assert listed.stderr == NOTICE.format(doing="using", path=path) + NOTICE_END + "\n"
    assert [t["task_id"] for t in json.loads(listed.stdout)] == ["t1"]


def test_run_says_it_too(elsewhere: Path) -> None:
    _invoke("enqueue", "pool-flow", "1", "--input", "1", "--checkpoint-id", "t1")
    ran = _invoke("run", "--app", APP, "--once", "--json")
    assert ran.exit_code == 0, ran.output
    assert ran.stderr.startswith(NOTICE.format(doing="using", path=elsewhere / "runifold-workflows.db"))
    assert json.loads(ran.stdout)["outcome"] == "completed"


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_named_store_is_used_without_a_word(
    elsewhere: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    url = f"sqlite:///{elsewhere / 'named.db'}"
    given = ["--database", url] if how == "option" else []
    if how == "environment":
        monkeypatch.setenv(ENV_VAR, url)
    for args in (
        ["enqueue", "pool-flow", "1", "--input", "1", "--app", APP],
        ["stats"],
        ["tenant", "list"],
        ["migrate"],
    ):
        result = _invoke(*args, *given)
        assert result.exit_code == 0, result.output
        assert result.stderr == ""
    assert (elsewhere / "named.db").exists() and not (elsewhere / "runifold-workflows.db").exists()
