"""The pytest plugin: declared as the ``runifold`` entry point, cheap to import, its
fixtures here in this suite (where it is loaded too), and the example test (docs/howto/testing.md) run
by pytest as a user's project would, on SQLite and on PostgreSQL, leaving no database."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import psycopg

from runifold_sync import WorkflowStore
from runifold_sync.testing import StoreClock
from runifold_sync.testing.plugin import DATABASE_PREFIX, DATABASE_URL_VARIABLE

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "expense"


def test_the_plugin_is_the_runifold_pytest11_entry_point() -> None:
    [plugin] = [ep for ep in entry_points(group="pytest11") if ep.name == "runifold"]
    assert plugin.value == "runifold_sync.testing.plugin"


def test_importing_the_plugin_opens_no_store_and_loads_no_driver() -> None:
    code = (
        "import sys, runifold_sync.testing.plugin; "
        "print(sorted(m for m in sys.modules if m.startswith(('psycopg', 'runifold_sync.store.sqlite.store', "
        "'runifold_sync.store.postgres.store', 'sqlite3'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_fixtures_are_here_with_names_of_their_own(
    runifold_store: WorkflowStore, runifold_clock: StoreClock, tmp_path: Path
) -> None:
    assert runifold_clock.store is runifold_store
    if not os.environ.get(DATABASE_URL_VARIABLE):
        assert (tmp_path / "runifold.db").exists()  # a SQLite file of this test's own


def run_example(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", str(EXAMPLE)]
    return subprocess.run(command, cwd=EXAMPLE, capture_output=True, text=True, env=env, timeout=120)


def test_the_example_passes_on_sqlite() -> None:
    env = {k: v for k, v in os.environ.items() if k != DATABASE_URL_VARIABLE}
    done = run_example(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def kit_databases(server: str) -> set[str]:
    with psycopg.connect(server, autocommit=True) as conn:
        rows = conn.execute("SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{DATABASE_PREFIX}%",))
        return {row[0] for row in rows}


def test_the_example_passes_on_a_fresh_postgresql_database_dropped_after(postgres_admin_url: str) -> None:
    before = kit_databases(postgres_admin_url)
    done = run_example(os.environ | {DATABASE_URL_VARIABLE: postgres_admin_url})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout
    assert kit_databases(postgres_admin_url) <= before


def test_nothing_in_the_library_imports_the_testing_kit() -> None:
    from tests.test_import_graph import import_graph

    importers = {
        name
        for name, imported in import_graph().items()
        if not name.startswith("runifold_sync.testing")
        and any(i.startswith("runifold_sync.testing") for i in imported)
    }
    assert importers == set()
