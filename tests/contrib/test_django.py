"""The Django integration, run in a subprocess so Django's process-wide setup (settings,
app registry) never reaches the other tests.

``django_cases.py`` holds the cases; this module runs them once with pytest in a child
process (``DJANGO_SETTINGS_MODULE=tests.contrib.django_settings``, the example project's
settings with Django's database in a temporary file) and reports each one here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from tests.support.backends import DatabasePool, with_database

REPO = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("django_cases.py")
EXAMPLE = REPO / "examples" / "django_project"
EXPECTED = [
    "test_view_inside_a_committed_transaction_enqueues_only_at_commit",
    "test_view_inside_a_rolled_back_transaction_enqueues_nothing",
    "test_view_in_autocommit_enqueues_when_its_atomic_block_commits",
    "test_enqueue_on_commit_checks_its_arguments_at_the_call",
    "test_manage_py_help_runworkflows_describes_the_command_and_each_option",
    "test_runworkflows_once_completes_the_task_and_its_effect_updates_the_row",
    "test_enqueue_checks_the_input_against_the_registry_runifold_app_names",
    "test_runworkflows_once_fails_with_status_1_when_the_task_fails",
    "test_invalid_settings_are_a_command_error",
    "test_a_concurrency_below_one_is_a_command_error_naming_it[0]",
    "test_a_concurrency_below_one_is_a_command_error_naming_it[-2]",
    "test_get_store_is_per_process_and_a_forked_child_opens_its_own",
    "test_runworkflows_pool_runs_tasks_in_forked_workers_that_use_the_orm",
]
DB_CASES = Path(__file__).with_name("django_db_cases.py")
DB_EXPECTED = [
    "test_a_rolled_back_view_leaves_no_task",
    "test_a_committed_view_leaves_one_task_that_runworkflows_runs",
    "test_manage_py_check_warns_when_the_stores_schema_is_behind",
    "test_a_transaction_step_writes_with_the_orm_in_its_checkpoints_transaction_and_replays_without_running",
    "test_a_fence_failure_rolls_back_the_steps_orm_write_with_its_checkpoint",
    "test_run_until_idle_on_get_store_runs_transaction_steps_on_djangos_connection",
    "test_a_view_that_opens_the_store_inside_its_write_transaction_enqueues_at_once",
    "test_an_in_memory_django_database_is_refused_naming_the_test_setting_to_give_it",
]


@attrs.frozen
class CaseRun:
    outcomes: dict[str, str]  # case name -> passed, failed, error or skipped
    details: dict[str, str] = attrs.field(repr=False)
    output: str = attrs.field(repr=False)


def run_cases(cases: Path, tmp: Path, **env_vars: str) -> CaseRun:
    """Run the cases file ``cases`` with pytest in a child process with the example
    project's settings and ``env_vars``, and read each case's outcome."""
    report = tmp / "report.xml"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.contrib.django_settings",
        "PYTHONPATH": os.pathsep.join([str(EXAMPLE), str(REPO)]),
        "RUNIFOLD_TEST_DJANGO_DB": str(tmp / "django.sqlite3"),
        # Every case overrides the store URL; this keeps stray writes out of the example.
        "RUNIFOLD_DATABASE_URL": f"sqlite:///{tmp}/unused-workflows.db",
        **env_vars,
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(cases),
            "-q",
            "-n",
            "0",  # a handful of cases: no worker processes of their own
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            f"--basetemp={tmp / 'cases'}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    if not report.exists():
        pytest.fail(f"the Django cases did not run (exit {proc.returncode}):\n{output}")
    outcomes: dict[str, str] = {}
    details: dict[str, str] = {}
    for case in ElementTree.parse(report).iter("testcase"):
        name = case.get("name", "")
        problems = [child for child in case if child.tag in ("failure", "error", "skipped")]
        outcomes[name] = problems[0].tag if problems else "passed"
        details[name] = "\n".join((p.get("message") or "") + "\n" + (p.text or "") for p in problems)
    return CaseRun(outcomes, details, output)


@pytest.fixture(scope="module")
def django_run(tmp_path_factory: pytest.TempPathFactory) -> CaseRun:
    return run_cases(CASES, tmp_path_factory.mktemp("django"))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def django_db_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CaseRun]:
    """The store-in-Django's-database cases, with Django on SQLite or on a fresh
    PostgreSQL database (emptied afterwards)."""
    tmp = tmp_path_factory.mktemp(f"django-{request.param}")
    if request.param == "sqlite":
        yield run_cases(DB_CASES, tmp)
        return
    request.getfixturevalue("postgres_admin_url")  # reachable, or skipped (failed under CI)
    databases: DatabasePool = request.getfixturevalue("postgres_databases")
    dbname = databases.take()
    try:
        yield run_cases(DB_CASES, tmp, RUNIFOLD_TEST_DJANGO_PG_URL=with_database(databases.admin_url, dbname))
    finally:
        databases.give_back(dbname)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", EXPECTED)
def test_django_case(django_run: CaseRun, case: str) -> None:
    assert django_run.outcomes.get(case) == "passed", (
        f"{case}: {django_run.outcomes.get(case, 'did not run')}\n"
        f"{django_run.details.get(case) or django_run.output}"
    )


def test_every_django_case_is_listed_here(django_run: CaseRun) -> None:
    assert sorted(django_run.outcomes) == sorted(EXPECTED)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("case", DB_EXPECTED)
def test_django_database_case(django_db_run: CaseRun, case: str) -> None:
    assert django_db_run.outcomes.get(case) == "passed", (
        f"{case}: {django_db_run.outcomes.get(case, 'did not run')}\n"
        f"{django_db_run.details.get(case) or django_db_run.output}"
    )
    assert sorted(django_db_run.outcomes) == sorted(DB_EXPECTED)


@pytest.mark.timeout(150)
def test_example_project_passes_its_own_tests_under_the_django_test_runner(tmp_path: Path) -> None:
    """``python manage.py test`` in examples/django_project: its ``shop/tests.py``
    enqueues from a view after commit and completes the task with ``runworkflows --once``."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "RUNIFOLD_DATABASE_URL": f"sqlite:///{tmp_path}/unused-workflows.db",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    proc = subprocess.run(
        [sys.executable, "manage.py", "test", "--noinput", "-v", "2"],
        cwd=EXAMPLE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = proc.stdout + proc.stderr
    assert proc.returncode == 0, report
    assert "Ran 2 tests" in report and "\nOK" in report
    assert "test_a_committed_order_is_enqueued_and_runworkflows_once_confirms_it" in report
