"""Integers and durations are range-checked where they are made, on both stores alike:
an integer a store keeps fits 64 bits (``max_leased`` PostgreSQL's INTEGER), a duration
a store keeps or adds to its clock is finite and at most ten years, and a JSON value
holding an integer too long to encode is refused naming the problem. Before, SQLite
raised ``OverflowError`` and PostgreSQL ``StoreUnavailable`` (retried as an outage)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.cli.main import main
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.validate import EARLIEST_MOMENT, INT64_MAX, INT64_MIN, LATEST_MOMENT
from runifold_sync.store import TenantBudget, TenantPolicy
from tests.support.backends import contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

TOO_LONG = 10**5000  # past Python's 4,300-digit limit for int -> str
APP = "tests.pool.pool_app:registry"


def test_the_largest_stored_integers_round_trip_and_one_more_is_refused_at_the_call(
    store: WorkflowStore,
) -> None:
    store.enqueue(WorkflowTask.new("orders", INT64_MAX, 2**70, checkpoint_id="big", priority=INT64_MAX))
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="low", priority=INT64_MIN))
    big = store.get_task("big")
    assert (big.definition_version, big.priority, big.input) == (INT64_MAX, INT64_MAX, 2**70)
    assert store.get_task("low").priority == INT64_MIN
    store.set_tenant_policy(TenantPolicy("default", max_leased=2**31 - 1))
    for build, field in (
        (lambda: WorkflowTask.new("orders", 1, None, priority=INT64_MAX + 1), "priority"),
        (lambda: WorkflowTask.new("orders", 1, None, priority=INT64_MIN - 1), "priority"),
        (lambda: WorkflowTask.new("orders", 2**64, None), "version"),
        (lambda: TenantPolicy("default", max_leased=2**31), "TenantPolicy.max_leased"),
        (lambda: TenantPolicy("default", max_leased=TOO_LONG), "TenantPolicy.max_leased"),
    ):
        with pytest.raises(InvalidArgument, match=f"^{field} must be an integer in "):
            build()


@pytest.mark.parametrize("value", [TOO_LONG, [1, {"n": -TOO_LONG}]], ids=["alone", "nested"])
def test_an_input_holding_an_integer_too_long_to_encode_is_refused_naming_the_problem(value: Any) -> None:
    with pytest.raises(InvalidArgument, match="holds an integer of more than 4,300 digits"):
        WorkflowTask.new("orders", 1, value)


def test_durations_past_ten_years_are_refused_where_they_are_made(store: WorkflowStore) -> None:
    ages = timedelta(days=3651)
    with pytest.raises(InvalidArgument, match="clock offset must be at most 3650 days"):
        store.set_clock_offset(ages)
    with pytest.raises(InvalidArgument, match="clock offset must be at most 3650 days"):
        store.set_clock_offset(-ages)
    with pytest.raises(InvalidArgument, match="lease duration must be at most 3650 days"):
        LeaseDuration(ages)
    with pytest.raises(InvalidArgument, match="TenantBudget.window must be at most 3650 days"):
        TenantBudget(1.0, ages)
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    (claimed,) = store.claim(WorkerId.parse("w1"), LeaseDuration(timedelta(seconds=30)))
    with pytest.raises(InvalidArgument, match="delay must be at most 3650 days"):
        store.retry(claimed.lease, claimed.revision, "{}", delay=ages, reason="later")
    with pytest.raises(InvalidArgument, match="delay must be at most 3650 days"):
        store.release(claimed.lease, delay=ages, reason="later")
    store.release(claimed.lease, delay=timedelta(days=3650), reason="the longest delay")  # accepted


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "--once", "--app", APP, "--lease", "inf"],
            "must be a number of seconds from 0.1 to 315360000, got inf",
        ),
        (
            ["run", "--once", "--app", APP, "--lease", "1e12"],
            "must be a number of seconds from 0.1 to 315360000",
        ),
        (
            ["tenant", "set", "t", "--budget", "5", "--budget-window", "inf"],
            "--budget-window must be a number",
        ),
        (["workers", "--live-within", "inf"], "--live-within must be a number of seconds"),
        (["enqueue", "orders", "1", "--priority", str(2**63)], "priority must be an integer in"),
        (["tenant", "set", "t", "--max-leased", str(2**70)], "TenantPolicy.max_leased must be an integer in"),
    ],
)
def test_the_cli_answers_an_out_of_range_number_with_one_line_and_no_traceback(
    args: list[str], message: str, tmp_path: Any
) -> None:
    result = CliRunner().invoke(main, [*args, "--database", f"sqlite:///{tmp_path}/w.db"])
    assert result.exit_code != 0
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


class _NoOffset(tzinfo):
    def utcoffset(self, dt: datetime | None) -> None:
        return None


def test_not_before_at_the_earliest_and_latest_moments_round_trips_and_past_them_is_refused(
    store: WorkflowStore,
) -> None:
    # Before, year 10000 in UTC was accepted and every read of the row then failed
    # (OverflowError on SQLite, DataError on PostgreSQL).
    for task_id, moment in (("early", EARLIEST_MOMENT), ("late", LATEST_MOMENT)):
        store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id=task_id, not_before=moment))
    assert store.get_task("late").ready_at == LATEST_MOMENT
    assert store.get_task("early").ready_at == store.get_task("early").created_at  # ready at once
    past = datetime(9999, 12, 31, 20, tzinfo=timezone(timedelta(hours=-14)))
    for moment in (
        past,
        LATEST_MOMENT + timedelta(microseconds=1),
        EARLIEST_MOMENT - timedelta(microseconds=1),
        datetime(1, 1, 1, 5, tzinfo=timezone(timedelta(hours=14))),
    ):
        with pytest.raises(InvalidArgument, match=r"^not_before must be from 0001-01-02T00:00:00\+00:00 to "):
            WorkflowTask.new("orders", 1, None, not_before=moment)
    with pytest.raises(
        InvalidArgument, match=r"^not_before must be a timezone-aware datetime, .*utcoffset\(\) is None"
    ):
        WorkflowTask.new("orders", 1, None, not_before=datetime(2030, 1, 1, tzinfo=_NoOffset()))


def test_a_value_the_database_cannot_hold_is_invalid_argument_not_an_outage(store: WorkflowStore) -> None:
    """Past every check (the task's own checks skipped here, as for a value one of them
    missed), the database's refusal of a value is still the caller's error:
    workers retry StoreUnavailable as an outage."""
    with attrs.validators.disabled():
        task = WorkflowTask("t1", "orders", 1, "null", "default", INT64_MAX + 1, None)
    with pytest.raises(InvalidArgument, match="refused a value"):
        store.enqueue(task)
    store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t2"))  # the store still works
    assert store.get_task("t2").priority == 0
