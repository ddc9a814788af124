"""What every route of one dashboard app reads: its store and its token."""

from __future__ import annotations

import attrs
import flask

from ..store.base import WorkflowStore

EXTENSION = "runifold_dashboard"


@attrs.frozen
class Dashboard:
    """The store one app shows, and its token (None: read-only)."""

    store: WorkflowStore
    token: str | None

    @property
    def read_only(self) -> bool:
        return self.token is None


def dashboard() -> Dashboard:
    """The :class:`Dashboard` of the app handling this request."""
    found = flask.current_app.extensions[EXTENSION]
    assert isinstance(found, Dashboard)
    return found
