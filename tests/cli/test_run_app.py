"""``run --app`` naming an ``App`` (or a function returning one): its workflows run on its
own store unless ``--database`` or ``RUNIFOLD_DATABASE_URL`` names another, and its
settings are the base the variables and options change; ``load_registry`` gives its
registry."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from runifold_sync import App
from runifold_sync.app import load_app, load_registry
from runifold_sync.cli.main import main
from runifold_sync.errors import AppNotLoaded
from runifold_sync.store import TaskOutcome

MODULE = "tests.cli.app_module"


@pytest.fixture
def app_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    monkeypatch.setenv("APP_MODULE_DB", url)
    monkeypatch.delenv("RUNIFOLD_DATABASE_URL", raising=False)
    monkeypatch.delitem(sys.modules, MODULE, raising=False)  # its App reads the variable on import
    return url


def _module() -> Any:
    return importlib.import_module(MODULE)


def _app(url: str) -> App:
    return App(url, registry=_module().app.registry)


@pytest.mark.parametrize("attribute", ["app", "make_app"])
def test_run_once_runs_an_apps_task_on_the_apps_own_store(app_url: str, attribute: str) -> None:
    with _app(app_url) as app:
        task = app.start("greeting", "ada")
    result = CliRunner().invoke(main, ["run", "--app", f"{MODULE}:{attribute}", "--once", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "outcome": "completed",
        "task_id": task.task_id,
        "result": "hello, ada",
    }
    assert "no --database" not in result.stderr  # the App named its store


def test_the_database_option_and_variable_win_over_the_apps_store(
    app_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with _app(other) as app:
        task = app.start("greeting", "grace")
    monkeypatch.setenv("RUNIFOLD_DATABASE_URL", other)
    result = CliRunner().invoke(main, ["run", "--app", f"{MODULE}:app", "--once", "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["task_id"] == task.task_id
    with _app(other) as app:
        assert app.handle(task.task_id).status().outcome is TaskOutcome.COMPLETED


def test_load_registry_and_load_app_accept_an_app(app_url: str) -> None:
    app_module = _module()
    assert load_app(f"{MODULE}:app") is app_module.app
    assert load_app(f"{MODULE}:make_app") is app_module.app
    registry = load_registry(f"{MODULE}:app")
    assert registry is app_module.app.registry and registry.get("greeting", 1) is not None
    with pytest.raises(AppNotLoaded, match="is not an App or a WorkflowRegistry"):
        load_app(f"{MODULE}:greeting")
