"""Django integration: add ``"runifold_sync.contrib.django"`` to ``INSTALLED_APPS``.

.. code-block:: python

    # settings.py
    RUNIFOLD_DATABASE_URL = "sqlite:///workflows.db"     # or postgresql://...
    RUNIFOLD_APP = "shop.workflows:registry"

    # a view
    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue_on_commit("order-intake", 1, {"order_id": order.pk})

    # workers
    python manage.py runworkflows --concurrency 4      # or --once from cron

Settings are the ``RUNIFOLD_*`` names of ``django.conf.settings``
(:class:`runifold_sync.Settings`): ``RUNIFOLD_DATABASE_URL`` (default
``$RUNIFOLD_DATABASE_URL``, else a local SQLite file), ``RUNIFOLD_APP``
(``module:attribute`` of the ``App`` or ``WorkflowRegistry``, needed where workers run),
``RUNIFOLD_CONCURRENCY``, ``RUNIFOLD_LEASE_SECONDS``, ``RUNIFOLD_CLAIM_BATCH``,
``RUNIFOLD_TRACING`` and the rest. ``RUNIFOLD_DATABASE`` (a Django database alias) puts
the store in that database instead of ``RUNIFOLD_DATABASE_URL``'s, and enqueues then
write in Django's transaction (:mod:`.database`).

The store is opened on first use in each process (a process forked afterwards opens its
own) and closed when the process exits.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Unpack

from django.conf import settings  # type: ignore[import-untyped]
from django.db import transaction  # type: ignore[import-untyped]

from ...app import App, StoreHook
from ...model.values import TaskOptions, WorkflowTask
from ...settings import SETTING_NAMES, Settings
from ...store.base import WorkflowStore
from . import database

__all__ = ["close_store", "enqueue", "enqueue_on_commit", "get_store", "runifold_settings"]

_current: App | None = None  # this process's App, made again when the settings change


def runifold_settings() -> Settings:
    """The ``RUNIFOLD_*`` settings, read from ``django.conf.settings`` on each call (so
    ``override_settings`` works), checked; ``InvalidArgument`` if one is wrong. With
    ``RUNIFOLD_DATABASE`` the store URL is that Django database's."""
    values = {n: getattr(settings, n) for n in SETTING_NAMES if hasattr(settings, n)}
    alias = database.store_alias()
    if alias is not None:
        values["RUNIFOLD_DATABASE_URL"] = database.store_url(alias)
    return Settings.from_mapping(values)


def _app() -> App:
    """The App of the current settings, its store opened on first use."""
    global _current
    current = runifold_settings()
    if _current is None or _current.settings != current:
        if _current is not None:
            _current.close()  # the settings changed (a test overriding them); only ours is closed
        _current = App(current, prepare=store_preparation())
    return _current


def get_store() -> WorkflowStore:
    """This process's store, opened on first use (and again in a forked child, or when
    ``RUNIFOLD_DATABASE_URL`` changes). In Django's database (``RUNIFOLD_DATABASE``),
    its transaction steps run on Django's connection (``run_until_idle(get_store(), ...)``
    in a test case sees, and writes in, the test's transaction)."""
    return _app().store


def store_preparation() -> StoreHook | None:
    """What a store needs under these settings: with the store in Django's database,
    transaction steps on Django's connection."""
    alias = database.store_alias()
    return None if alias is None else partial(database.transaction_steps_on_django, alias=alias)


def close_store() -> None:
    """Close this process's store if it opened one (done at process exit)."""
    if _current is not None:
        _current.close()


def _task(name: str, version: int, input: Any, options: TaskOptions) -> WorkflowTask:
    """The task, checked by the registry ``RUNIFOLD_APP`` names when it names one."""
    app = _app()
    if app.settings.app is None:
        return WorkflowTask.new(name, version, input, **options)
    return app.registry.task(name, version, input, **options)


def enqueue(name: str, version: int, input: Any, **options: Unpack[TaskOptions]) -> str:
    """Enqueue a task and return its id. With ``RUNIFOLD_DATABASE`` (the store in
    Django's database) it is written on Django's connection in the current transaction
    (``atomic()``, a savepoint inside one): it exists only if that commits. Otherwise at
    once, in the store's own database, whatever Django transaction is open."""
    task = _task(name, version, input, options)
    alias = database.store_alias()
    if alias is None:
        return get_store().enqueue(task).task_id
    with transaction.atomic(using=alias):
        return get_store().enqueue(task, connection=database.raw_connection(alias)).task_id


def enqueue_on_commit(
    name: str, version: int, input: Any, *, using: str | None = None, **options: Unpack[TaskOptions]
) -> str:
    """Enqueue a task when the current transaction on Django database ``using`` commits,
    never if it rolls back; outside ``atomic()`` at once. Returns the id the task will
    have. The arguments are checked now, so a bad input fails in the view, not at commit.

    When the workflow store and Django's database are two databases, and the store cannot
    be reached just after the commit, the commit stands and the enqueue raises (from the
    commit): pass a ``checkpoint_id`` derived from the row (``f"order-{order.pk}"``) so a
    sweep or a retry can enqueue it again without starting a second workflow. With
    ``RUNIFOLD_DATABASE`` naming database ``using``, the task is written in its
    transaction instead (:func:`enqueue`), which has no such gap.
    """
    if database.store_alias() == (using or "default"):
        return enqueue(name, version, input, **options)
    task = _task(name, version, input, options)
    transaction.on_commit(lambda: get_store().enqueue(task), using=using)
    return task.task_id
