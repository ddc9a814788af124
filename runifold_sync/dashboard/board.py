"""What every route of one dashboard app reads: its store, its token and its registry."""

from __future__ import annotations

import attrs
import flask

from ..definition import WorkflowRegistry
from ..store.base import WorkflowStore

EXTENSION = "runifold_dashboard"


@attrs.frozen
class Dashboard:
    """The store one app shows, its token (None: read-only), and the registry whose
    definitions' budgets a task's page sets its usage against (None: not shown)."""

    store: WorkflowStore
    token: str | None
    registry: WorkflowRegistry | None = None

    @property
    def read_only(self) -> bool:
        return self.token is None


def dashboard() -> Dashboard:
    """The :class:`Dashboard` of the app handling this request."""
    found = flask.current_app.extensions[EXTENSION]
    assert isinstance(found, Dashboard)
    return found
