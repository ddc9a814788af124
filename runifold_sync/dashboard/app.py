"""``create_app``: the dashboard's Flask app over one store, with its security headers,
its session (signed with a key made per app unless one is given), its error pages and
its routes (:mod:`.views` for the pages, :mod:`.actions` for the POSTs)."""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

import flask

from ..errors import InvalidArgument, RunifoldError, StoreUnavailable, TaskNotFound
from ..model import validate
from ..store.base import WorkflowStore
from ..store.checks import DEFAULT_LOGIN_LIFETIME
from ..workflow.registry import WorkflowRegistry
from . import actions, formatting, security, views
from .board import EXTENSION, Dashboard, dashboard


def create_app(
    store: WorkflowStore,
    *,
    token: str | None = None,
    secret_key: bytes | None = None,
    registry: WorkflowRegistry | None = None,
    session_lifetime: timedelta = DEFAULT_LOGIN_LIFETIME,
) -> flask.Flask:
    """The dashboard over ``store`` as a WSGI app. With ``token`` (a non-empty string)
    the actions need it (:mod:`.security`); without one the dashboard is read-only.
    ``secret_key`` signs the session cookie; by default a random key made here, so
    sessions end when the app does (give one to share sessions between processes).
    A login lasts ``session_lifetime`` of store time (4 hours by default) unless its
    operator logs out first; both end it in the store, for every process serving the
    dashboard. With ``registry``, a task's page shows its usage against its
    definition's budget (which lives in code, not in the store)."""
    if not isinstance(store, WorkflowStore):
        raise InvalidArgument(f"store must be a WorkflowStore, got {type(store).__name__}")
    if token is not None and (not isinstance(token, str) or not token.strip()):
        # The value is not repeated: it is a secret, even when it is a wrong one.
        raise InvalidArgument(f"dashboard token must be a non-empty string, got a {type(token).__name__}")
    if secret_key is not None and (not isinstance(secret_key, bytes) or len(secret_key) < 16):
        raise InvalidArgument("dashboard secret_key must be at least 16 bytes")
    if registry is not None and not isinstance(registry, WorkflowRegistry):
        raise InvalidArgument(f"registry must be a WorkflowRegistry, got {type(registry).__name__}")
    validate.positive_duration("dashboard session_lifetime", session_lifetime)
    app = flask.Flask(__name__.rsplit(".", 1)[0], static_folder="static", template_folder="templates")
    app.secret_key = secret_key or secrets.token_bytes(32)
    app.config.update(
        SESSION_COOKIE_NAME="runifold_dashboard",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        MAX_CONTENT_LENGTH=1024 * 1024,
    )
    app.extensions[EXTENSION] = Dashboard(store, token, registry, session_lifetime)
    app.after_request(security.add_headers)
    app.context_processor(_page_context)
    formatting.install(app)
    app.url_map.converters["task_id"] = views.TaskIdConverter
    app.url_map.merge_slashes = False  # "a//b" is a task id, not a path to tidy
    app.register_blueprint(views.pages)
    app.register_blueprint(actions.posts)
    app.register_error_handler(TaskNotFound, _not_found)
    app.register_error_handler(InvalidArgument, _bad_request)
    app.register_error_handler(RunifoldError, _refused)
    app.register_error_handler(StoreUnavailable, _unavailable)
    return app


def _page_context() -> dict[str, Any]:
    board = dashboard()
    try:
        logged_in = security.authenticated(board.token)
    except StoreUnavailable:  # the page saying so is drawn, without the forms to act
        logged_in = False
    return {
        "read_only": board.read_only,
        "logged_in": logged_in,
        "actor": flask.session.get(security.ACTOR) or "",
        "csrf_token": security.csrf_token,
        "csrf_field": security.CSRF_FIELD,
    }


def error_page(status: int, title: str, message: str) -> tuple[str, int]:
    return flask.render_template("error.html", title=title, message=message, status=status), status


def _not_found(exc: TaskNotFound) -> tuple[str, int]:
    return error_page(404, "Not found", str(exc))


def _bad_request(exc: InvalidArgument) -> tuple[str, int]:
    return error_page(400, "Bad request", str(exc))


def _refused(exc: RunifoldError) -> tuple[str, int]:
    """An action the store refused (a task in the wrong state, a signal refused)."""
    return error_page(409, "Refused", str(exc))


def _unavailable(exc: StoreUnavailable) -> tuple[str, int]:
    return error_page(503, "Store unavailable", str(exc))
