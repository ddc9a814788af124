"""What a non-editable install gets: the files the package needs at run time, the
console script, and a core install (no PostgreSQL driver, no web framework) that runs
the README's demo."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "runifold_sync"


def test_a_build_carries_py_typed_and_every_sql_file(tmp_path: Path) -> None:
    # setuptools' build_py is what a wheel is made from; it needs no network.
    build = [sys.executable, "-c", "import setuptools; setuptools.setup()", "-q", "build_py"]
    done = subprocess.run([*build, "--build-lib", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    built = tmp_path / "runifold_sync"
    assert (built / "py.typed").is_file()
    sql = sorted(p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.sql"))
    assert sql, "the package keeps its queries and migrations in .sql files"
    assert sorted(p.relative_to(built) for p in built.rglob("*.sql")) == sql


def test_the_console_script_runs_the_cli() -> None:
    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("runifold") == "runifold_sync.cli.main:main"


@pytest.mark.timeout(120)
def test_the_demo_runs_without_the_optional_dependencies(tmp_path: Path) -> None:
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    for name in ("psycopg", "psycopg_pool", "flask", "django"):
        (blocker / f"{name}.py").write_text(f"raise ImportError('{name} is not installed')\n")
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "runifold_sync", "demo", "--orders", "1"],
        cwd=work,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{blocker}:{ROOT}"},
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1/1 completed" in done.stdout
