"""What every route of one dashboard app reads: its store, its token and its registry."""

from __future__ import annotations

from datetime import timedelta

import attrs
import flask

from ..store.base import WorkflowStore
from ..store.checks import DEFAULT_LOGIN_LIFETIME
from ..workflow.registry import WorkflowRegistry

EXTENSION = "runifold_dashboard"


@attrs.frozen
class Dashboard:
    """The store one app shows, its token (None: read-only), the registry whose
    definitions' budgets a task's page sets its usage against (None: not shown), and how
    long a login lasts."""

    store: WorkflowStore
    token: str | None
    registry: WorkflowRegistry | None = None
    session_lifetime: timedelta = DEFAULT_LOGIN_LIFETIME

    @property
    def read_only(self) -> bool:
        return self.token is None


def dashboard() -> Dashboard:
    """The :class:`Dashboard` of the app handling this request."""
    found = flask.current_app.extensions[EXTENSION]
    assert isinstance(found, Dashboard)
    return found
