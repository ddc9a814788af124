"""``Settings``: one application's store, workers and pool, in one frozen tree.

``Settings(database_url, app=None, worker=WorkerSettings(...), pool=PoolSettings(...),
tracing=False)`` is read from keyword arguments (:meth:`Settings.replace` takes every
field by its name, ``claim_batch=4`` or ``concurrency=8``), from a mapping of
``RUNIFOLD_*`` keys (Flask's ``app.config``, Django's settings: :meth:`Settings.from_mapping`)
or from ``RUNIFOLD_*`` environment variables (:meth:`Settings.from_env`). Each field has
one default and one check, on the field itself (``worker/settings.py``,
``pool/supervisor.py`` and below): a bad value is :class:`InvalidArgument` naming the
field, or the ``RUNIFOLD_*`` key it was read from, and the value. The CLI's ``run``, the
Flask and Django integrations and :class:`~runifold_sync.App` all read them here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from .errors import InvalidArgument
from .model import validate
from .model.redaction import redacted
from .model.values import LeaseDuration
from .pool.supervisor import PoolSettings
from .store.open import default_url
from .worker.settings import AUTO, WorkerSettings
from .workflow.registry import WorkflowRegistry


def _url(name: str, value: object) -> object:
    if not isinstance(value, str) or not value:
        validate.refuse(name, "a string naming a store (sqlite:///path.db, postgresql://...)", value)
    return value


def _app(name: str, value: object) -> object:
    if value is not None and not isinstance(value, (str, WorkflowRegistry)):
        validate.refuse(
            name,
            "a 'module:attribute' string naming an App or a WorkflowRegistry, or a WorkflowRegistry",
            value,
        )
    return value


@attrs.frozen
class Settings:
    """What an application's workers run with: the store (``database_url``; default
    ``$RUNIFOLD_DATABASE_URL``, else the local SQLite file ``runifold-workflows.db``), the
    registry they serve (``app``: a ``'module:attribute'`` reference to an
    :class:`~runifold_sync.App` or a registry, or a registry; only ``run`` and the
    framework integrations need it), each worker's :class:`WorkerSettings`, the pool's
    :class:`PoolSettings`, and whether workers trace with OpenTelemetry (``tracing``;
    the CLI and the framework integrations build the tracer).

    ========================================  ===============================  ======================
    key (mapping, environment)                field                            default
    ========================================  ===============================  ======================
    ``RUNIFOLD_DATABASE_URL``                 ``database_url``                 see above
    ``RUNIFOLD_APP``                          ``app``                          None
    ``RUNIFOLD_TRACING``                      ``tracing``                      False
    ``RUNIFOLD_LEASE_SECONDS``                ``worker.lease_duration``        30 s
    ``RUNIFOLD_HEARTBEAT_SECONDS``            ``worker.heartbeat_interval``    a third of the lease
    ``RUNIFOLD_CLAIM_BATCH``                  ``worker.claim_batch``           ``auto`` (1 to 10)
    ``RUNIFOLD_MAX_STEPS_PER_CLAIM``          ``worker.max_steps_per_claim``   None (no limit)
    ``RUNIFOLD_MAX_ENTRY_BYTES``              ``worker.max_entry_bytes``       1 MiB
    ``RUNIFOLD_UNAVAILABLE_DELAY_SECONDS``    ``worker.unavailable_delay``     5 s
    ``RUNIFOLD_QUEUES``                       ``worker.queues``                ``default``
    ``RUNIFOLD_CONCURRENCY``                  ``pool.concurrency``             1
    ``RUNIFOLD_MIN_BACKOFF_SECONDS``          ``pool.min_backoff``             0.025 s
    ``RUNIFOLD_MAX_BACKOFF_SECONDS``          ``pool.max_backoff``             5 s
    ``RUNIFOLD_SHUTDOWN_GRACE_SECONDS``       ``pool.shutdown_grace``          60 s
    ``RUNIFOLD_RECYCLE_AFTER``                ``pool.recycle_after_tasks``     None (never)
    ========================================  ===============================  ======================

    Durations are seconds in a mapping or the environment (a number there, its text
    here), timedeltas as fields; ``RUNIFOLD_QUEUES`` is a list of names or one string of
    them separated by commas (``"gpu,default"``); a flag in the environment is
    ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off``. The URL is printed
    without its password."""

    database_url: str = validate.field(_url, attrs.Factory(default_url), repr=lambda url: repr(redacted(url)))
    app: str | WorkflowRegistry | None = validate.field(_app, None)
    worker: WorkerSettings = validate.field(validate.is_a(WorkerSettings), attrs.Factory(WorkerSettings))
    pool: PoolSettings = validate.field(validate.is_a(PoolSettings), attrs.Factory(PoolSettings))
    tracing: bool = validate.field(validate.flag, False)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, base: Settings | None = None) -> Settings:
        """``base`` (default: the defaults) with the ``RUNIFOLD_*`` keys of ``values`` put
        in: Flask's ``app.config``, Django's settings gathered into a dict, the CLI's
        options. A key absent or None keeps its default; other keys are ignored."""
        return _read(values, base or cls(), "a mapping")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, base: Settings | None = None) -> Settings:
        """``base`` with the ``RUNIFOLD_*`` variables of ``environ`` (default
        ``os.environ``) put in; an empty variable counts as unset."""
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for key, (_field, _read_value, from_text) in _KEYS.items():
            text = environ.get(key, "").strip()
            if text:
                values[key] = from_text(key, text)
        return _read(values, base or cls(), "the environment")

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes``, each named as its field: ``database_url``, ``app``,
        ``tracing``, ``worker``, ``pool``, or a field of the worker's or the pool's
        settings (``claim_batch=4``, ``concurrency=8``). Another name is
        :class:`InvalidArgument` listing them all."""
        top: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {"worker": {}, "pool": {}}
        for name, value in changes.items():
            section = _FIELDS.get(name)
            if section is None:
                raise InvalidArgument(f"{name!r} is not a setting; the settings are {', '.join(_FIELDS)}")
            (top if section == "" else sections[section])[name] = value
        settings = attrs.evolve(self, **top)
        if sections["worker"]:
            settings = attrs.evolve(settings, worker=settings.worker.replace(**sections["worker"]))
        if sections["pool"]:
            settings = attrs.evolve(settings, pool=attrs.evolve(settings.pool, **sections["pool"]))
        return settings


def parse_queues(value: object, key: str = "RUNIFOLD_QUEUES") -> tuple[str, ...]:
    """Queue names given as a list, or as one string separated by commas (the form
    ``RUNIFOLD_QUEUES`` has in the environment: the CLI splits the variable with this
    too, so it means the same queues to every entry point)."""
    if isinstance(value, str):
        names = [name.strip() for name in value.split(",")]
    elif isinstance(value, (list, tuple)):
        names = list(value)
    else:
        validate.refuse(key, "queue names", value)
    return tuple(dict.fromkeys(validate.name(f"{key} queue", name) for name in names))


def _as_is(_key: str, value: object) -> object:
    return value


def _seconds(key: str, value: object) -> object:
    return validate.seconds(key, value)


def _lease(key: str, value: object) -> object:
    lease = validate.seconds(key, value)
    if not lease:
        validate.refuse(key, "a number of seconds above 0", value)
    return LeaseDuration(lease)


def _integer_text(key: str, text: str) -> object:
    try:
        return int(text)
    except ValueError:
        validate.refuse(key, "an integer", text)


def _claim_batch_text(key: str, text: str) -> object:
    if text.strip() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        validate.refuse(key, "'auto' or an integer", text)


def _number_text(key: str, text: str) -> object:
    try:
        return float(text)
    except ValueError:
        validate.refuse(key, "a number of seconds", text)


_FLAGS = {
    "1": True,
    "true": True,
    "yes": True,
    "on": True,
    "0": False,
    "false": False,
    "no": False,
    "off": False,
}


def _flag_text(key: str, text: str) -> object:
    try:
        return _FLAGS[text.lower()]
    except KeyError:
        validate.refuse(key, f"one of {', '.join(_FLAGS)}", text)


Reader = Callable[[str, Any], object]

# Each key: the field it sets, how a mapping's value becomes the field's, and how an
# environment variable's text becomes a mapping's value.
_KEYS: dict[str, tuple[str, Reader, Reader]] = {
    "RUNIFOLD_DATABASE_URL": ("database_url", _as_is, _as_is),
    "RUNIFOLD_APP": ("app", _as_is, _as_is),
    "RUNIFOLD_TRACING": ("tracing", _as_is, _flag_text),
    "RUNIFOLD_LEASE_SECONDS": ("lease_duration", _lease, _number_text),
    "RUNIFOLD_HEARTBEAT_SECONDS": ("heartbeat_interval", _seconds, _number_text),
    "RUNIFOLD_CLAIM_BATCH": ("claim_batch", _as_is, _claim_batch_text),
    "RUNIFOLD_MAX_STEPS_PER_CLAIM": ("max_steps_per_claim", _as_is, _integer_text),
    "RUNIFOLD_MAX_ENTRY_BYTES": ("max_entry_bytes", _as_is, _integer_text),
    "RUNIFOLD_UNAVAILABLE_DELAY_SECONDS": ("unavailable_delay", _seconds, _number_text),
    "RUNIFOLD_QUEUES": ("queues", lambda key, value: parse_queues(value, key), _as_is),
    "RUNIFOLD_CONCURRENCY": ("concurrency", _as_is, _integer_text),
    "RUNIFOLD_MIN_BACKOFF_SECONDS": ("min_backoff", _seconds, _number_text),
    "RUNIFOLD_MAX_BACKOFF_SECONDS": ("max_backoff", _seconds, _number_text),
    "RUNIFOLD_SHUTDOWN_GRACE_SECONDS": ("shutdown_grace", _seconds, _number_text),
    "RUNIFOLD_RECYCLE_AFTER": ("recycle_after_tasks", _as_is, _integer_text),
}
SETTING_NAMES = tuple(_KEYS)

# Every field by its name, with its section ("" for the top of the tree).
_FIELDS: dict[str, str] = {
    **{a.name: "" for a in attrs.fields(Settings)},
    **{a.name: "worker" for a in attrs.fields(WorkerSettings)},
    **{a.name: "pool" for a in attrs.fields(PoolSettings)},
}
_CLASSES: dict[str, type] = {"": Settings, "worker": WorkerSettings, "pool": PoolSettings}


def _read(values: Mapping[str, Any], base: Settings, source: str) -> Settings:
    """``base`` with the keys of ``values`` put in, each checked by its field's check
    under its own key's name; a rule between two fields (a heartbeat at most half the
    lease) names the keys it was read from."""
    changes: dict[str, Any] = {}
    given: dict[str, str] = {}
    for key, (field, read_value, _from_text) in _KEYS.items():
        raw = values.get(key)
        if raw is None:
            continue
        try:
            value = read_value(key, raw)
            attrs.fields_dict(_CLASSES[_FIELDS[field]])[field].metadata["check"](key, value)
        except InvalidArgument as exc:
            if repr(raw) in str(exc):
                raise
            raise InvalidArgument(f"{exc} (read from {source}: {key}={raw!r})") from exc
        changes[field] = value
        given[field] = f"{key}={raw!r}"
    try:
        return base.replace(**changes)
    except InvalidArgument as exc:
        named = [text for field, text in given.items() if field in str(exc)]
        raise InvalidArgument(f"{exc} (read from {source}: {', '.join(named) or 'defaults'})") from exc
