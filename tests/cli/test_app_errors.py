"""An ``--app`` that cannot be loaded: one line naming the module, where its import
raised (file:line) and what, exit status 2, ``{"error", "type"}`` under ``--json``, the
traceback only with ``--verbose``; a module not on the import path says where it was
looked for and how to add it. Real subprocesses, run from a directory holding the app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import processes

COMMANDS = {
    "run": ["run", "--once"],
    "enqueue": ["enqueue", "flow", "1"],
    "versions": ["versions"],
}


def _run(tmp_path: Path, command: str, app: str, *extra: str) -> tuple[int, str, str]:
    args = [*COMMANDS[command], "--app", app, "--database", f"sqlite:///{tmp_path / 'store.db'}", *extra]
    done = processes.run("runifold_sync", *args, cwd=tmp_path, timeout_s=60)
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_an_app_that_raises_on_import_is_one_line_naming_module_file_line_and_error(
    tmp_path: Path, command: str
) -> None:
    (tmp_path / "raising_app.py").write_text('settings = {}\nregistry = settings["REGISTRY"]\n')
    code, out, err = _run(tmp_path, command, "raising_app:registry")
    assert code == 2 and out == ""
    message = (
        "importing 'raising_app' (app reference 'raising_app:registry') raised at "
        f"{tmp_path / 'raising_app.py'}:2: KeyError: 'REGISTRY'"
    )
    assert err.splitlines()[-1] == f"Error: {message}"
    assert "Traceback" not in err and "Usage:" not in err
    code, out, err = _run(tmp_path, command, "raising_app:registry", "--json")
    assert code == 2
    assert json.loads(out) == {"error": message, "type": "AppNotLoaded"}


def test_a_syntax_error_names_its_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "broken_app.py").write_text("import os\n\ndef registry(:\n    pass\n")
    code, out, err = _run(tmp_path, "run", "broken_app:registry", "--json")
    assert code == 2
    error = json.loads(out)["error"]
    assert error.startswith(
        f"importing 'broken_app' (app reference 'broken_app:registry') raised at "
        f"{tmp_path / 'broken_app.py'}:3: SyntaxError: "
    )
    assert "\n" not in error and "Traceback" not in err


def test_verbose_keeps_the_traceback_of_what_the_import_raised(tmp_path: Path) -> None:
    (tmp_path / "raising_app.py").write_text('settings = {}\nregistry = settings["REGISTRY"]\n')
    code, _, err = _run(tmp_path, "run", "raising_app:registry", "--verbose")
    assert code == 2
    assert "Traceback (most recent call last):" in err
    assert 'registry = settings["REGISTRY"]' in err  # the application's line, as Python shows it
    assert err.splitlines()[-1].startswith("Error: importing 'raising_app'")


def test_a_registry_factory_that_raises_is_said_in_one_line_too(tmp_path: Path) -> None:
    (tmp_path / "factory_app.py").write_text("def registry():\n    return 1 / 0\n")
    code, _, err = _run(tmp_path, "versions", "factory_app:registry")
    assert code == 2
    assert err.splitlines() == [
        "Error: calling 'registry' of 'factory_app' (app reference 'factory_app:registry') raised at "
        f"{tmp_path / 'factory_app.py'}:2: ZeroDivisionError: division by zero"
    ]


def test_a_missing_app_module_says_where_it_was_looked_for_and_how_to_add_it(tmp_path: Path) -> None:
    code, out, err = _run(tmp_path, "run", "not_here_app:registry", "--json")
    assert code == 2
    assert json.loads(out) == {
        "error": "cannot import 'not_here_app' from app reference 'not_here_app:registry': no module "
        f"'not_here_app' in {tmp_path} (the directory this runs from) or elsewhere on the import "
        "path; run from the project's root, or add the directory that holds it to PYTHONPATH",
        "type": "AppNotLoaded",
    }


def test_a_module_the_app_imports_that_is_missing_is_the_apps_error_not_a_missing_app(
    tmp_path: Path,
) -> None:
    (tmp_path / "needy_app.py").write_text("import os\nimport not_installed_dependency_x\n")
    code, _, err = _run(tmp_path, "run", "needy_app:registry")
    assert code == 2
    assert err.splitlines()[-1] == (
        "Error: importing 'needy_app' (app reference 'needy_app:registry') raised at "
        f"{tmp_path / 'needy_app.py'}:2: ModuleNotFoundError: No module named 'not_installed_dependency_x'"
    )
