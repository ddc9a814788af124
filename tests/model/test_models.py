"""Validation of value types: bad input is refused where it is given, naming the value."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runifold_sync import (
    Budget,
    BudgetUsage,
    LeaseDuration,
    RetryPolicy,
    WorkerId,
    Workflow,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.values import MAX_INPUT_BYTES
from runifold_sync.sqlite import SqliteWorkflowStore


def refused(build: Callable[[], Any], *fragments: str) -> InvalidArgument:
    """Assert ``build()`` raises InvalidArgument (a ValueError) whose message contains
    every fragment; returns the error for further checks."""
    with pytest.raises(InvalidArgument) as info:
        build()
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return info.value


# --- workflow names and versions ----------------------------------------------------


def test_empty_workflow_name_is_refused_by_task_and_workflow() -> None:
    refused(lambda: WorkflowTask.new("", 1, {}), "workflow name", "''")
    refused(lambda: Workflow("", 1), "workflow name", "''")


@pytest.mark.parametrize("name", ["order\nintake", "order\x00intake", "tab\there"])
def test_workflow_name_with_control_characters_is_refused(name: str) -> None:
    refused(lambda: WorkflowTask.new(name, 1, {}), "control characters", repr(name))
    refused(lambda: Workflow(name, 1), "control characters", repr(name))


@pytest.mark.parametrize("version", [0, -1, True, "1", 1.0])
def test_version_that_is_not_an_integer_of_at_least_one_is_refused(version: Any) -> None:
    refused(lambda: WorkflowTask.new("orders", version, {}), "version", f"got {version!r}")
    refused(lambda: Workflow("orders", version), "version", f"got {version!r}")


# --- task input -----------------------------------------------------------------------


def test_unserializable_object_input_is_refused_naming_it() -> None:
    value = object()
    refused(lambda: WorkflowTask.new("orders", 1, value), repr(value), "not JSON-serializable")


def test_nan_input_is_refused_naming_it() -> None:
    refused(lambda: WorkflowTask.new("orders", 1, {"amount": float("nan")}), "nan", "not JSON-serializable")


def test_input_over_one_mebibyte_is_refused_naming_size_and_limit() -> None:
    payload = "x" * MAX_INPUT_BYTES  # encodes with two quotes: two bytes over
    refused(
        lambda: WorkflowTask.new("orders", 1, payload),
        f"{MAX_INPUT_BYTES + 2} bytes",
        f"limit of {MAX_INPUT_BYTES}",
    )


def test_input_exactly_at_the_limit_is_accepted() -> None:
    task = WorkflowTask.new("orders", 1, "x" * (MAX_INPUT_BYTES - 2))
    assert len(task.input_json.encode()) == MAX_INPUT_BYTES


def test_naive_not_before_is_refused_naming_it() -> None:
    naive = datetime(2030, 1, 1, 12, 0)
    refused(lambda: WorkflowTask.new("orders", 1, {}, not_before=naive), "timezone-aware", repr(naive))


def test_aware_not_before_is_kept() -> None:
    aware = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
    assert WorkflowTask.new("orders", 1, {}, not_before=aware).not_before == aware


# --- worker ids and leases --------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "worker 1", "-leading-dash", "w/1", "wörker", "a" * 129])
def test_bad_worker_id_is_refused_naming_it(text: str) -> None:
    refused(lambda: WorkerId.parse(text), "worker id", repr(text))


def test_worker_id_with_allowed_punctuation_parses() -> None:
    assert str(WorkerId.parse("host-1.pod:7@eu_west")) == "host-1.pod:7@eu_west"


@pytest.mark.parametrize("value", [timedelta(0), timedelta(seconds=-5)])
def test_lease_duration_that_is_not_positive_is_refused(value: timedelta) -> None:
    refused(lambda: LeaseDuration(value), "lease duration", repr(value))


# --- budgets and retry policies ------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_steps", -1),
        ("max_steps", 0),
        ("max_cost", -0.5),
        ("max_duration", timedelta(seconds=-1)),
        ("max_attempts", 0),
        ("max_attempts", -3),
    ],
)
def test_budget_limit_that_is_not_positive_is_refused(field: str, value: Any) -> None:
    refused(lambda: Budget(**{field: value}), f"Budget.{field}", repr(value))


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_steps", 1.5, "an integer"),
        ("max_steps", timedelta(5), "an integer"),
        ("max_steps", True, "an integer"),
        ("max_steps", "3", "an integer"),
        ("max_cost", timedelta(1), "a finite number"),
        ("max_cost", float("nan"), "a finite number"),
        ("max_cost", float("inf"), "a finite number"),
        ("max_cost", True, "a finite number"),
        ("max_cost", "5", "a finite number"),
        ("max_duration", 5, "datetime.timedelta"),
        ("max_duration", 5.0, "datetime.timedelta"),
        ("max_attempts", 2.0, "an integer"),
        ("max_attempts", None, "an integer"),
    ],
)
def test_budget_limit_of_another_type_is_refused_naming_field_and_value(
    field: str, value: Any, expected: str
) -> None:
    refused(lambda: Budget(**{field: value}), f"Budget.{field}", expected, repr(value))


def test_budget_cost_too_large_for_a_float_is_refused() -> None:
    refused(lambda: Budget(max_cost=10**400), "Budget.max_cost", "a finite number")


def test_budget_limits_of_their_own_types_are_kept() -> None:
    budget = Budget(max_steps=3, max_cost=2, max_duration=timedelta(minutes=1), max_attempts=2)
    assert (budget.max_steps, budget.max_cost, budget.max_duration) == (3, 2, timedelta(minutes=1))
    assert Budget(max_cost=0.5).max_cost == 0.5


@pytest.mark.parametrize("multiplier", [None, timedelta(1), float("nan"), float("inf"), True, 0, -2.0])
def test_retry_multiplier_that_is_not_a_finite_positive_number_is_refused(multiplier: Any) -> None:
    refused(lambda: RetryPolicy(multiplier=multiplier), "RetryPolicy.multiplier", repr(multiplier))


@pytest.mark.parametrize("jitter", [-0.1, 1.0, 1.5])
def test_retry_jitter_outside_zero_to_one_is_refused(jitter: float) -> None:
    refused(lambda: RetryPolicy(jitter=jitter), "jitter", repr(jitter))


def test_backoff_grows_by_the_multiplier_and_is_capped_at_max_backoff() -> None:
    policy = RetryPolicy(
        initial_backoff=timedelta(seconds=1),
        max_backoff=timedelta(seconds=5),
        multiplier=2.0,
        jitter=0.0,
    )
    assert [policy.backoff_s(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_backoff_stays_within_the_jitter_band_and_is_spread() -> None:
    policy = RetryPolicy(initial_backoff=timedelta(seconds=10), max_backoff=timedelta(seconds=15), jitter=0.2)
    for failures, base in [(1, 10.0), (2, 15.0), (5, 15.0)]:
        samples = [policy.backoff_s(failures) for _ in range(300)]
        assert all(base * 0.8 <= s <= base * 1.2 for s in samples)
        assert max(samples) - min(samples) > base * 0.1  # jitter actually spreads delays


@pytest.mark.parametrize("multiplier", [2.0, 10.0, 1.01])
@pytest.mark.parametrize("failures", [1_025, 10_000, 10**9])
def test_backoff_after_very_many_failures_is_max_backoff_not_an_overflow(
    multiplier: float, failures: int
) -> None:
    # Before: OverflowError (34, 'Numerical result out of range') from multiplier ** n,
    # which failed the task (after 309 retries at multiplier 10).
    exact = RetryPolicy(max_backoff=timedelta(minutes=5), multiplier=multiplier, jitter=0.0)
    assert exact.backoff_s(failures) == 300.0
    jittered = RetryPolicy(max_backoff=timedelta(minutes=5), multiplier=multiplier, jitter=0.2)
    assert all(240.0 <= jittered.backoff_s(failures) <= 360.0 for _ in range(100))


@pytest.mark.parametrize("multiplier", [0.5, 1.0])
def test_backoff_that_does_not_grow_stays_at_or_below_initial_backoff(multiplier: float) -> None:
    policy = RetryPolicy(initial_backoff=timedelta(seconds=4), multiplier=multiplier, jitter=0.0)
    assert policy.backoff_s(1) == 4.0
    assert policy.backoff_s(10**9) == (4.0 if multiplier == 1.0 else 0.0)


def test_jittered_backoff_never_exceeds_the_longest_delay_a_store_accepts() -> None:
    # store.retry refuses a delay over 3650 days: a max_backoff of 3650 days and jitter
    # would have made the retry itself fail.
    longest = timedelta(days=3650)
    policy = RetryPolicy(initial_backoff=longest, max_backoff=longest, jitter=0.5)
    assert all(policy.backoff_s(3) <= longest.total_seconds() for _ in range(100))


# --- budget usage -------------------------------------------------------------------------

usages = st.builds(
    BudgetUsage,
    steps=st.integers(0, 10_000),
    cost=st.floats(0, 1e9),
    elapsed_s=st.floats(0, 1e9),
    claims=st.integers(0, 10_000),
)


@given(
    usage=usages,
    steps=st.integers(0, 100),
    cost=st.floats(0, 1e6),
    elapsed_s=st.floats(-1e6, 1e6),
    claims=st.integers(0, 100),
)
def test_budget_usage_add_never_decreases_any_field(
    usage: BudgetUsage, steps: int, cost: float, elapsed_s: float, claims: int
) -> None:
    grown = usage.add(steps=steps, cost=cost, elapsed_s=elapsed_s, claims=claims)
    assert grown.covers(usage)
    assert grown.steps == usage.steps + steps
    assert grown.claims == usage.claims + claims


def test_budget_usage_add_ignores_negative_elapsed_time() -> None:
    usage = BudgetUsage(elapsed_s=3.0)
    assert usage.add(elapsed_s=-2.0).elapsed_s == 3.0


@pytest.mark.parametrize(
    ("build", "fragments"),
    [
        (
            lambda: BudgetUsage(cost=1e308).add(cost=1e308),
            ("cost 1e+308 added to 1e+308", "past the largest float"),
        ),
        (lambda: BudgetUsage().add(cost=float("inf")), ("cost must be a finite number >= 0, got inf",)),
        (lambda: BudgetUsage().add(cost=float("nan")), ("cost must be a finite number >= 0, got nan",)),
        (lambda: BudgetUsage(elapsed_s=1e308).add(elapsed_s=1e308), ("elapsed_s must stay finite",)),
    ],
    ids=["cost-overflow", "cost-inf", "cost-nan", "elapsed-overflow"],
)
def test_budget_usage_refuses_to_become_non_finite(
    build: Callable[[], Any], fragments: tuple[str, ...]
) -> None:
    # Usage is stored as JSON, which has no infinity: a total that overflowed made every
    # later commit of the task fail.
    refused(build, *fragments)


def test_budget_reports_the_limit_that_was_exceeded() -> None:
    budget = Budget(max_steps=2, max_cost=10.0)
    assert budget.exceeded(BudgetUsage(steps=2, cost=10.0)) is None
    assert "max_steps=2" in (budget.exceeded(BudgetUsage(steps=3)) or "")
    assert "max_cost=10.0" in (budget.exceeded(BudgetUsage(cost=10.5)) or "")


# --- worker construction --------------------------------------------------------------------


def _worker(store: SqliteWorkflowStore, lease: timedelta, heartbeat: timedelta) -> WorkflowWorker:
    return WorkflowWorker(store, WorkflowRegistry(), WorkerId.parse("w1"), LeaseDuration(lease), heartbeat)


def test_worker_heartbeat_over_half_the_lease_is_refused(sqlite_store: SqliteWorkflowStore) -> None:
    refused(
        lambda: _worker(sqlite_store, timedelta(seconds=10), timedelta(seconds=6)),
        "at most half the lease",
        "heartbeat_interval 6 s",
        "lease_duration 10 s",
    )


def test_worker_zero_heartbeat_is_refused(sqlite_store: SqliteWorkflowStore) -> None:
    refused(
        lambda: _worker(sqlite_store, timedelta(seconds=10), timedelta(0)),
        "heartbeat_interval must be positive",
        "got datetime.timedelta(0)",
    )


def test_worker_heartbeat_of_exactly_half_the_lease_is_accepted(sqlite_path: Path) -> None:
    store = SqliteWorkflowStore.open(sqlite_path)
    worker = _worker(store, timedelta(seconds=10), timedelta(seconds=5))
    worker.close()
    store.close()


def test_budget_usage_refuses_negative_increments() -> None:
    refused(lambda: BudgetUsage().add(cost=-1.0), "usage only grows", "cost=-1.0")


def test_retry_policy_max_attempts_must_be_an_integer() -> None:
    refused(lambda: RetryPolicy(max_attempts=2.5), "RetryPolicy.max_attempts", "2.5")  # type: ignore[arg-type]
