"""The Django app config: label ``runifold``; checks the settings at startup."""

from __future__ import annotations

import atexit

from django.apps import AppConfig  # type: ignore[import-untyped]
from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]

from ...errors import InvalidArgument


class RunifoldConfig(AppConfig):  # type: ignore[misc]
    name = "runifold_sync.contrib.django"
    label = "runifold"
    verbose_name = "Runifold workflows"

    def ready(self) -> None:
        from django.core import checks  # type: ignore[import-untyped]

        from . import close_store, database, runifold_settings

        checks.register(database.schema_check)

        try:
            runifold_settings()
        except InvalidArgument as exc:
            raise ImproperlyConfigured(str(exc)) from exc
        atexit.register(close_store)
