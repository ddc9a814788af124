"""``enqueue --not-before``: the CLI's form of ``WorkflowTask.new(not_before=...)``, the
one option of it the command lacked (``--tenant``, ``--priority`` and
``--checkpoint-id`` it had). An ISO 8601 time with its offset, or a delay counted from
store time; a bad value is a usage error naming it, and nothing is enqueued."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runifold_sync.cli.main import main
from runifold_sync.sqlite import SqliteWorkflowStore
from runifold_sync.store import TaskOutcome

APP = "tests.pool.pool_app:registry"


@pytest.fixture
def url(sqlite_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("POOL_LEDGER", str(tmp_path / "ledger.txt"))
    return f"sqlite:///{sqlite_path}"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_a_delay_counts_from_store_time_and_the_task_waits_for_it(url: str, sqlite_path: Path) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    store.set_clock_offset(timedelta(hours=1))  # store time an hour ahead of this host's clock
    before = store.now()
    result = _invoke(
        "enqueue",
        "pool-flow",
        "1",
        "--input",
        "1",
        "--checkpoint-id",
        "t1",
        "--not-before",
        "1h30m",
        "--database",
        url,
        "--json",
    )
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    start = datetime.fromisoformat(shown["not_before"])
    assert before + timedelta(minutes=90) <= start <= store.now() + timedelta(minutes=90)
    assert store.get_task("t1").ready_at == start

    idle = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    assert json.loads(idle.stdout)["outcome"] == "idle"  # not claimable yet
    store.set_clock_offset(timedelta(hours=2, minutes=31))
    done = _invoke("run", "--app", APP, "--database", url, "--once", "--json")
    assert json.loads(done.stdout)["outcome"] == "completed"
    assert store.get_task("t1").outcome is TaskOutcome.COMPLETED
    store.close()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("2030-01-02T03:04:05+01:00", datetime(2030, 1, 2, 2, 4, 5, tzinfo=UTC)),
        ("2030-01-02T03:04:05Z", datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)),
    ],
)
def test_an_iso_time_with_its_offset_is_kept_as_given(
    url: str, sqlite_path: Path, given: str, expected: datetime
) -> None:
    result = _invoke(
        "enqueue", "pool-flow", "1", "--checkpoint-id", "t1", "--not-before", given, "--database", url
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == f"t1 (enqueued, not before {datetime.fromisoformat(given).isoformat()})\n"
    with SqliteWorkflowStore.open(sqlite_path) as store:
        assert store.get_task("t1").ready_at == expected
        assert "scheduled: not claimable before 2030-01-02" in str(store.get_task("t1").status_note)


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("soon", "is neither an ISO 8601 time"),
        ("30", "is neither an ISO 8601 time"),  # a delay needs its unit
        ("-5m", "is neither an ISO 8601 time"),
        ("2030-01-02T03:04:05", "has no UTC offset: add one (+01:00, or Z for UTC)"),
        ("3651d", "is longer than 3650 days"),
    ],
)
def test_a_bad_start_is_a_usage_error_naming_it_and_nothing_is_enqueued(
    url: str, sqlite_path: Path, given: str, why: str
) -> None:
    result = _invoke("enqueue", "pool-flow", "1", "--not-before", given, "--database", url)
    assert result.exit_code == 2
    assert f"Invalid value for '--not-before': {given!r} {why}" in result.stderr
    assert not sqlite_path.exists()  # refused before the store was opened


def test_enqueueing_an_existing_task_again_keeps_its_start(url: str, sqlite_path: Path) -> None:
    first = _invoke(
        "enqueue",
        "pool-flow",
        "1",
        "--checkpoint-id",
        "t1",
        "--not-before",
        "5m",
        "--database",
        url,
        "--json",
    )
    again = _invoke(
        "enqueue",
        "pool-flow",
        "1",
        "--checkpoint-id",
        "t1",
        "--not-before",
        "10m",
        "--database",
        url,
        "--json",
    )
    assert json.loads(again.stdout) == {"task_id": "t1", "created": False, "not_before": None}
    with SqliteWorkflowStore.open(sqlite_path) as store:
        assert store.get_task("t1").ready_at == datetime.fromisoformat(json.loads(first.stdout)["not_before"])
