"""Fixtures of the dashboard tests: a seeded store on each backend (``tests/support``),
an app over it with a token, and a test client that can log in."""

from __future__ import annotations

import re

import flask
import pytest
from flask.testing import FlaskClient

from runifold_sync import WorkflowStore
from runifold_sync.dashboard import create_app

from .flows import Seeded, seed

TOKEN = "test-token-7d1f"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def seeded(store: WorkflowStore) -> Seeded:
    return seed(store)


@pytest.fixture
def app(store: WorkflowStore, seeded: Seeded) -> flask.Flask:
    return create_app(store, token=TOKEN)


@pytest.fixture
def client(app: flask.Flask) -> FlaskClient:
    return app.test_client()


def csrf_of(client: FlaskClient, path: str = "/login", headers: dict[str, str] | None = None) -> str:
    """The session's CSRF token, read from the form of the page at ``path``."""
    page = client.get(path, headers=headers or {})
    found = _CSRF.search(page.get_data(as_text=True))
    assert found is not None, f"no CSRF field on {path}"
    return found.group(1)


def log_in(client: FlaskClient, actor: str = "alice") -> str:
    """Log ``client`` in with the token; returns the CSRF token of its new session."""
    response = client.post("/login", data={"csrf_token": csrf_of(client), "token": TOKEN, "actor": actor})
    assert response.status_code == 303, response.get_data(as_text=True)
    return csrf_of(client, "/")
