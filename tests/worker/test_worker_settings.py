"""``WorkerSettings`` (a worker's settings, their defaults and checks in one place), the
one integer check they and the rest of the package use (``validate.integer``), and the
crash-point bracket around each claim-ending write (``crashpoints.transition``)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    LeaseDuration,
    PoolSettings,
    WorkerId,
    WorkerSettings,
    WorkflowRegistry,
    WorkflowSupervisor,
    WorkflowSupervisorConfig,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.model import crashpoints
from runifold_sync.model.checkpoint import DEFAULT_MAX_ENTRY_BYTES
from runifold_sync.model.validate import integer
from runifold_sync.sqlite import SqliteWorkflowStore

LEASE = LeaseDuration(timedelta(seconds=10))


def test_defaults_are_a_30_s_lease_beaten_every_10_s_claims_sized_automatically() -> None:
    settings = WorkerSettings()
    assert settings == WorkerSettings(
        lease_duration=LeaseDuration(timedelta(seconds=30)),
        heartbeat_interval=timedelta(seconds=10),
        claim_batch="auto",
        max_steps_per_claim=None,
        max_entry_bytes=DEFAULT_MAX_ENTRY_BYTES,
        unavailable_delay=timedelta(seconds=5),
    )


def test_the_worker_takes_lease_and_heartbeat_first_and_refuses_a_keyword_that_is_no_setting(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    fields = [f.name for f in attrs.fields(WorkerSettings)]
    assert fields[:2] == ["lease_duration", "heartbeat_interval"]
    with pytest.raises(InvalidArgument, match="^claim_size: not a worker setting; the worker settings are "):
        WorkflowWorker(sqlite_store, WorkflowRegistry(), WorkerId.parse("w1"), claim_size=4)


def test_a_worker_takes_its_settings_as_keywords_or_as_an_object_and_keywords_override_it(
    sqlite_store: SqliteWorkflowStore,
) -> None:
    def worker(*args: Any, **kwargs: Any) -> WorkflowWorker:
        built = WorkflowWorker(sqlite_store, WorkflowRegistry(), WorkerId.parse("w1"), *args, **kwargs)
        built.close()
        return built

    expected = WorkerSettings(LEASE, timedelta(seconds=2), claim_batch=4, max_steps_per_claim=3)
    by_keywords = worker(LEASE, timedelta(seconds=2), claim_batch=4, max_steps_per_claim=3)
    assert by_keywords.settings == expected
    assert worker(settings=expected).settings == expected
    longer = attrs.evolve(expected, lease_duration=LeaseDuration(timedelta(seconds=20)))
    overridden = worker(LEASE, settings=longer, claim_batch=9)
    assert overridden.settings == attrs.evolve(expected, claim_batch=9)
    assert overridden.lease_duration == LEASE
    assert worker().settings == WorkerSettings()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"claim_batch": 0}, "claim_batch must be 'auto' or an integer in 1..100, got 0"),
        ({"claim_batch": 101}, "claim_batch must be 'auto' or an integer in 1..100, got 101"),
        ({"claim_batch": True}, "claim_batch must be 'auto' or an integer in 1..100, got True"),
        ({"max_steps_per_claim": 0}, "max_steps_per_claim must be an integer >= 1, got 0"),
        ({"max_steps_per_claim": 2.0}, "max_steps_per_claim must be an integer >= 1, got 2.0"),
        ({"max_entry_bytes": 1023}, "max_entry_bytes must be an integer >= 1024, got 1023"),
        (
            {"unavailable_delay": timedelta(seconds=-1)},
            "unavailable_delay must be non-negative, got datetime.timedelta(days=-1, seconds=86399)",
        ),
        ({"lease_duration": timedelta(seconds=30)}, "lease_duration must be a LeaseDuration, got"),
        ({"heartbeat_interval": 5}, "heartbeat_interval must be a datetime.timedelta, got 5"),
        (
            {"heartbeat_interval": timedelta(0)},
            "heartbeat_interval must be positive, got datetime.timedelta(0)",
        ),
        (
            {"heartbeat_interval": timedelta(seconds=16)},
            "heartbeat_interval 16 s must be at most half the lease_duration 30 s",
        ),
        ({"queues": ()}, "queues must name at least one queue"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_field_and_the_value(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        WorkerSettings(**options)
    assert str(info.value).startswith(message)


def test_a_supervisor_config_checks_its_fields_however_it_is_built() -> None:
    with pytest.raises(InvalidArgument, match="min_backoff 2 s is above max_backoff 1 s"):
        WorkflowSupervisorConfig(1, min_backoff=timedelta(seconds=2), max_backoff=timedelta(seconds=1))
    with pytest.raises(InvalidArgument, match=r"min_backoff must be positive, got datetime.timedelta\(0\)"):
        WorkflowSupervisorConfig(1).with_backoff(timedelta(0), timedelta(seconds=1))
    with pytest.raises(InvalidArgument, match="recycle_after_tasks must be an integer >= 1, got 0"):
        WorkflowSupervisorConfig(1).with_recycling(0)
    with pytest.raises(
        InvalidArgument, match=r"shutdown_grace must be positive, got datetime.timedelta\(0\)"
    ):
        WorkflowSupervisorConfig(1, shutdown_grace=timedelta(0))
    assert WorkflowSupervisorConfig(1).with_recycling(5).recycle_after_tasks == 5
    assert WorkflowSupervisorConfig(8).with_backoff(
        timedelta(seconds=0.1), timedelta(seconds=2)
    ) == PoolSettings(8, min_backoff=timedelta(seconds=0.1), max_backoff=timedelta(seconds=2))


def _never_started(worker_id: WorkerId) -> WorkflowWorker:
    raise AssertionError(f"no worker is started here, yet {worker_id} was")


@pytest.mark.parametrize(
    ("base_id", "concurrency"),
    [("bad id", 2), ("", 2), ("-pool", 2), ("pool/1", 2), (5, 2), (None, 2), ("a" * 123, 2), ("a" * 122, 11)],
)
def test_a_supervisor_base_id_that_makes_bad_worker_ids_is_refused_naming_it(
    base_id: object, concurrency: int
) -> None:
    with pytest.raises(InvalidArgument) as info:
        WorkflowSupervisor(_never_started, WorkflowSupervisorConfig(concurrency), base_id=base_id)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("base_id must be ")
    assert message.endswith(f"got {base_id!r}")


def test_a_supervisor_base_id_as_long_as_its_worker_ids_allow_is_kept() -> None:
    """Room for ``-<slot>.<n>``: a slot's later incarnations are ``<base>-<slot>.1`` to ``.999``."""
    WorkflowSupervisor(_never_started, WorkflowSupervisorConfig(2), base_id="a" * 122)
    WorkflowSupervisor(_never_started, WorkflowSupervisorConfig(10), base_id="a" * 122)  # slots 0-9
    WorkflowSupervisor(_never_started, WorkflowSupervisorConfig(10), base_id="pool:eu@host.1_a-b")


@pytest.mark.parametrize(
    ("bounds", "value", "message"),
    [
        ({"minimum": 1}, 0, "n must be an integer >= 1, got 0"),
        ({"minimum": 1}, True, "n must be an integer >= 1, got True"),
        ({"minimum": 1}, "3", "n must be an integer >= 1, got '3'"),
        ({"minimum": 1, "maximum": 5}, 6, "n must be an integer in 1..5, got 6"),
        ({"maximum": 5}, 6, "n must be an integer <= 5, got 6"),
        ({}, 1.0, "n must be an integer, got 1.0"),
    ],
)
def test_integer_refuses_values_outside_its_bounds_and_non_integers(
    bounds: dict[str, int], value: object, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        integer("n", value, **bounds)
    assert str(info.value) == message


def test_integer_returns_the_value_at_its_bounds() -> None:
    assert integer("n", 1, minimum=1, maximum=5) == 1
    assert integer("n", 5, minimum=1, maximum=5) == 5
    assert integer("n", -(10**30)) == -(10**30)


def test_a_transition_block_reaches_its_before_point_and_its_after_point_only_when_the_write_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reached: list[tuple[str, str]] = []
    monkeypatch.setattr(crashpoints, "ARMED", {"before_transition": None, "after_transition": None})
    monkeypatch.setattr(crashpoints, "reached", lambda point, subject="": reached.append((point, subject)))
    with crashpoints.transition("complete"):
        reached.append(("write", ""))
    with pytest.raises(RuntimeError), crashpoints.transition("fail"):
        raise RuntimeError("the write was refused")
    assert reached == [
        ("before_transition", "complete"),
        ("write", ""),
        ("after_transition", "complete"),
        ("before_transition", "fail"),
    ]
