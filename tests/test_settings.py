"""``Settings``: one tree of an application's settings, read from keywords, from a
mapping of ``RUNIFOLD_*`` keys and from ``RUNIFOLD_*`` variables, with one default and
one check per field; a refusal names the field (or the key it was read from) and the
value."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import LeaseDuration, PoolSettings, Settings, WorkerSettings, WorkflowRegistry
from runifold_sync.errors import InvalidArgument
from runifold_sync.model.checkpoint import DEFAULT_MAX_ENTRY_BYTES
from runifold_sync.settings import SETTING_NAMES
from runifold_sync.store.open import DEFAULT_URL


@attrs.frozen
class Field:
    key: str
    path: str  # "worker.claim_batch"
    default: Any
    given: Any  # a good value in a mapping
    read: Any  # what the field holds then
    text: str  # the same value as an environment variable
    bad: Any  # a value the field refuses, in a mapping
    refusal: str  # how the refusal of ``bad`` starts
    bad_text: str  # a variable's text that is no value of the field
    text_refusal: str


def _s(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


FIELDS = [
    Field(
        "RUNIFOLD_DATABASE_URL",
        "database_url",
        DEFAULT_URL,
        "postgresql://db/jobs",
        "postgresql://db/jobs",
        "postgresql://db/jobs",
        5,
        "RUNIFOLD_DATABASE_URL must be a string naming a store",
        "",  # an empty variable is unset: nothing to refuse
        "",
    ),
    Field(
        "RUNIFOLD_APP",
        "app",
        None,
        "shop.workflows:app",
        "shop.workflows:app",
        "shop.workflows:app",
        42,
        "RUNIFOLD_APP must be a 'module:attribute' string",
        "",
        "",
    ),
    Field(
        "RUNIFOLD_TRACING",
        "tracing",
        False,
        True,
        True,
        "yes",
        "yes",
        "RUNIFOLD_TRACING must be True or False, got 'yes'",
        "maybe",
        "RUNIFOLD_TRACING must be one of 1, true, yes, on, 0, false, no, off, got 'maybe'",
    ),
    Field(
        "RUNIFOLD_LEASE_SECONDS",
        "worker.lease_duration",
        LeaseDuration(_s(30)),
        12,
        LeaseDuration(_s(12)),
        "12",
        0,
        "RUNIFOLD_LEASE_SECONDS must be a number of seconds above 0, got 0",
        "long",
        "RUNIFOLD_LEASE_SECONDS must be a number of seconds, got 'long'",
    ),
    Field(
        "RUNIFOLD_HEARTBEAT_SECONDS",
        "worker.heartbeat_interval",
        _s(10),
        4.5,
        _s(4.5),
        "4.5",
        0,
        "RUNIFOLD_HEARTBEAT_SECONDS must be positive, got datetime.timedelta(0)",
        "often",
        "RUNIFOLD_HEARTBEAT_SECONDS must be a number of seconds, got 'often'",
    ),
    Field(
        "RUNIFOLD_CLAIM_BATCH",
        "worker.claim_batch",
        "auto",
        8,
        8,
        "8",
        101,
        "RUNIFOLD_CLAIM_BATCH must be 'auto' or an integer in 1..100, got 101",
        "8.5",
        "RUNIFOLD_CLAIM_BATCH must be 'auto' or an integer, got '8.5'",
    ),
    Field(
        "RUNIFOLD_MAX_STEPS_PER_CLAIM",
        "worker.max_steps_per_claim",
        None,
        50,
        50,
        "50",
        0,
        "RUNIFOLD_MAX_STEPS_PER_CLAIM must be an integer >= 1, got 0",
        "x",
        "RUNIFOLD_MAX_STEPS_PER_CLAIM must be an integer, got 'x'",
    ),
    Field(
        "RUNIFOLD_MAX_ENTRY_BYTES",
        "worker.max_entry_bytes",
        DEFAULT_MAX_ENTRY_BYTES,
        4096,
        4096,
        "4096",
        1000,
        "RUNIFOLD_MAX_ENTRY_BYTES must be an integer >= 1024, got 1000",
        "4k",
        "RUNIFOLD_MAX_ENTRY_BYTES must be an integer, got '4k'",
    ),
    Field(
        "RUNIFOLD_UNAVAILABLE_DELAY_SECONDS",
        "worker.unavailable_delay",
        _s(5),
        0,
        _s(0),
        "0",
        -1,
        "RUNIFOLD_UNAVAILABLE_DELAY_SECONDS must be a number of seconds from 0",
        "soon",
        "RUNIFOLD_UNAVAILABLE_DELAY_SECONDS must be a number of seconds, got 'soon'",
    ),
    Field(
        "RUNIFOLD_QUEUES",
        "worker.queues",
        ("default",),
        ["gpu", "default"],
        ("gpu", "default"),
        "gpu, default",
        "gpu,,default",
        "RUNIFOLD_QUEUES queue must be non-empty",
        "gpu,,",
        "RUNIFOLD_QUEUES queue must be non-empty",
    ),
    Field(
        "RUNIFOLD_CONCURRENCY",
        "pool.concurrency",
        1,
        4,
        4,
        "4",
        0,
        "RUNIFOLD_CONCURRENCY must be an integer >= 1, got 0",
        "four",
        "RUNIFOLD_CONCURRENCY must be an integer, got 'four'",
    ),
    Field(
        "RUNIFOLD_MIN_BACKOFF_SECONDS",
        "pool.min_backoff",
        _s(0.025),
        0.5,
        _s(0.5),
        "0.5",
        0,
        "RUNIFOLD_MIN_BACKOFF_SECONDS must be positive, got datetime.timedelta(0)",
        "-",
        "RUNIFOLD_MIN_BACKOFF_SECONDS must be a number of seconds, got '-'",
    ),
    Field(
        "RUNIFOLD_MAX_BACKOFF_SECONDS",
        "pool.max_backoff",
        _s(5),
        2,
        _s(2),
        "2",
        True,
        "RUNIFOLD_MAX_BACKOFF_SECONDS must be a number of seconds from 0",
        "2s",
        "RUNIFOLD_MAX_BACKOFF_SECONDS must be a number of seconds, got '2s'",
    ),
    Field(
        "RUNIFOLD_SHUTDOWN_GRACE_SECONDS",
        "pool.shutdown_grace",
        _s(60),
        10,
        _s(10),
        "10",
        0,
        "RUNIFOLD_SHUTDOWN_GRACE_SECONDS must be positive, got datetime.timedelta(0)",
        "a minute",
        "RUNIFOLD_SHUTDOWN_GRACE_SECONDS must be a number of seconds, got 'a minute'",
    ),
    Field(
        "RUNIFOLD_RECYCLE_AFTER",
        "pool.recycle_after_tasks",
        None,
        100,
        100,
        "100",
        0,
        "RUNIFOLD_RECYCLE_AFTER must be an integer >= 1, got 0",
        "1e3",
        "RUNIFOLD_RECYCLE_AFTER must be an integer, got '1e3'",
    ),
]
IDS = [f.key for f in FIELDS]


def _at(settings: Settings, path: str) -> Any:
    value: Any = settings
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_every_setting_name_has_its_case_here() -> None:
    assert sorted(SETTING_NAMES) == sorted(IDS)
    flat = {f.path.split(".")[-1] for f in FIELDS} | {"worker", "pool"}
    every = {a.name for cls in (Settings, WorkerSettings, PoolSettings) for a in attrs.fields(cls)}
    assert flat == every  # every field of the tree is read from a key


def test_claim_batch_auto_is_read_from_a_mapping_the_environment_and_keywords() -> None:
    assert Settings.from_mapping({"RUNIFOLD_CLAIM_BATCH": 4}).worker.claim_batch == 4
    assert Settings.from_mapping({"RUNIFOLD_CLAIM_BATCH": "auto"}).worker.claim_batch == "auto"
    assert Settings.from_env({"RUNIFOLD_CLAIM_BATCH": "auto"}).worker.claim_batch == "auto"
    assert Settings().replace(claim_batch=3).replace(claim_batch="auto").worker.claim_batch == "auto"


@pytest.mark.parametrize("field", FIELDS, ids=IDS)
def test_each_setting_has_its_default(field: Field, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNIFOLD_DATABASE_URL", raising=False)
    assert _at(Settings(), field.path) == field.default
    assert _at(Settings.from_mapping({}), field.path) == field.default
    assert _at(Settings.from_env({}), field.path) == field.default
    assert _at(Settings.from_mapping({field.key: None}), field.path) == field.default


@pytest.mark.parametrize("field", FIELDS, ids=IDS)
def test_each_setting_is_read_from_a_mapping_the_environment_and_keywords(field: Field) -> None:
    from_mapping = Settings.from_mapping({field.key: field.given})
    assert _at(from_mapping, field.path) == field.read
    assert _at(Settings.from_env({field.key: field.text}), field.path) == field.read
    name = field.path.split(".")[-1]
    assert _at(Settings().replace(**{name: field.read}), field.path) == field.read
    assert Settings().replace(**{name: field.read}) == from_mapping


@pytest.mark.parametrize("field", FIELDS, ids=IDS)
def test_each_setting_refuses_a_bad_value_naming_its_key_and_the_value(field: Field) -> None:
    with pytest.raises(InvalidArgument) as refused:
        Settings.from_mapping({field.key: field.bad})
    assert str(refused.value).startswith(field.refusal)
    if field.bad_text:
        with pytest.raises(InvalidArgument) as refused_text:
            Settings.from_env({field.key: field.bad_text})
        assert str(refused_text.value).startswith(field.text_refusal)


@pytest.mark.parametrize(
    ("changes", "refusal"),
    [
        ({"database_url": ""}, "database_url must be a string naming a store"),
        ({"app": 42}, "app must be a 'module:attribute' string"),
        ({"tracing": "yes"}, "tracing must be True or False, got 'yes'"),
        ({"lease_duration": 30}, "lease_duration must be a LeaseDuration, got 30"),
        ({"heartbeat_interval": 5}, "heartbeat_interval must be a datetime.timedelta, got 5"),
        ({"claim_batch": 0}, "claim_batch must be 'auto' or an integer in 1..100, got 0"),
        ({"max_steps_per_claim": 0}, "max_steps_per_claim must be an integer >= 1, got 0"),
        ({"max_entry_bytes": 10}, "max_entry_bytes must be an integer >= 1024, got 10"),
        (
            {"unavailable_delay": _s(-1)},
            "unavailable_delay must be non-negative, got datetime.timedelta(days=-1, seconds=86399)",
        ),
        ({"queues": ()}, "queues must name at least one queue"),
        ({"concurrency": 0}, "concurrency must be an integer >= 1, got 0"),
        ({"min_backoff": _s(0)}, "min_backoff must be positive, got datetime.timedelta(0)"),
        ({"max_backoff": 5}, "max_backoff must be a datetime.timedelta, got 5"),
        ({"shutdown_grace": _s(0)}, "shutdown_grace must be positive, got datetime.timedelta(0)"),
        ({"recycle_after_tasks": 0}, "recycle_after_tasks must be an integer >= 1, got 0"),
        ({"worker": PoolSettings()}, "worker must be a WorkerSettings, got PoolSettings("),
        ({"pool": None}, "pool must be a PoolSettings, got None"),
    ],
)
def test_a_keyword_setting_is_refused_naming_the_field_and_the_value(
    changes: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(InvalidArgument) as refused:
        Settings().replace(**changes)
    assert str(refused.value).startswith(refusal)


def test_a_name_that_is_no_setting_is_refused_listing_the_settings() -> None:
    with pytest.raises(
        InvalidArgument, match="^'concurency' is not a setting; the settings are database_url, "
    ):
        Settings().replace(concurency=4)


def test_a_rule_between_two_fields_names_both_and_the_keys_they_were_read_from() -> None:
    with pytest.raises(InvalidArgument) as refused:
        Settings.from_mapping({"RUNIFOLD_LEASE_SECONDS": 2, "RUNIFOLD_HEARTBEAT_SECONDS": 1.5})
    assert str(refused.value) == (
        "heartbeat_interval 1.5 s must be at most half the lease_duration 2 s, so one missed beat does "
        "not lose the lease (read from a mapping: RUNIFOLD_LEASE_SECONDS=2, RUNIFOLD_HEARTBEAT_SECONDS=1.5)"
    )
    with pytest.raises(
        InvalidArgument, match=r"min_backoff 3 s is above max_backoff 2 s \(read from the env"
    ):
        Settings.from_env({"RUNIFOLD_MIN_BACKOFF_SECONDS": "3", "RUNIFOLD_MAX_BACKOFF_SECONDS": "2"})


def test_a_heartbeat_left_at_its_default_follows_the_lease_and_one_given_stays() -> None:
    assert Settings().replace(lease_duration=LeaseDuration(_s(60))).worker.heartbeat_interval == _s(20)
    given = Settings().replace(heartbeat_interval=_s(3))
    assert given.replace(lease_duration=LeaseDuration(_s(60))).worker.heartbeat_interval == _s(3)


def test_the_environment_and_a_mapping_layer_over_a_base() -> None:
    base = Settings("sqlite:///base.db", worker=WorkerSettings(claim_batch=4))
    env = Settings.from_env({"RUNIFOLD_CONCURRENCY": "3", "RUNIFOLD_OTHER": "x"}, base=base)
    assert (env.database_url, env.worker.claim_batch, env.pool.concurrency) == ("sqlite:///base.db", 4, 3)
    layered = Settings.from_mapping({"RUNIFOLD_CLAIM_BATCH": 2, "SECRET_KEY": "k"}, base=env)
    assert (layered.worker.claim_batch, layered.pool.concurrency) == (2, 3)


def test_the_default_store_is_the_environments_and_a_registry_may_be_the_app(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNIFOLD_DATABASE_URL", "sqlite:///from-env.db")
    assert Settings().database_url == "sqlite:///from-env.db"
    registry = WorkflowRegistry()
    assert Settings.from_mapping({"RUNIFOLD_APP": registry}).app is registry


def test_the_settings_print_no_store_password() -> None:
    settings = Settings("postgresql://app:SECRETPW@db/jobs")
    assert "SECRETPW" not in repr(settings) and "postgresql://app:***@db/jobs" in repr(settings)
