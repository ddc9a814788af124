"""Who may act, and the headers every response carries.

An action needs the token, in one of two ways:

- an ``Authorization: Bearer`` header (an API client, curl): nothing else is needed. A
  browser never sends that header by itself, and a page of another site cannot make it
  send one here (it is not a header a cross-origin request may carry without the
  dashboard's consent, which it never gives), so such a request cannot be forged;
- a session logged in with the login form (which stores a digest of the token in
  Flask's signed session cookie: HttpOnly, SameSite=Strict), plus the session's CSRF
  token in the form field ``csrf_token``: a browser sends the cookie with any request,
  so the CSRF token is what shows the form is the dashboard's own. A missing or wrong
  one is refused with 403. The cookie also carries the id of the session's login in the
  store (``store.start_login``), checked on every request: a logout ends it there, and
  so does the app's ``session_lifetime``, so a cookie kept from before either no longer
  acts, in any process serving the dashboard.

Without either the request is refused with 401.

With no token configured the dashboard is read-only: every POST is 403. Tokens are
compared with :func:`hmac.compare_digest`, and never logged or rendered.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import flask

from .board import dashboard

# The session keys: the digest of the token the session logged in with, the name it gave
# (the actor its actions are recorded under), and its CSRF token.
AUTH = "auth"
ACTOR = "actor"
CSRF = "csrf"
LOGIN = "login"  # the id of the session's login in the store
CSRF_FIELD = "csrf_token"

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    # Pages show stored inputs and results, and the forms carry the CSRF token: none is
    # kept by a browser or a proxy.
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


def token_digest(token: str) -> str:
    """What a logged-in session holds of the token: a digest, so the cookie (signed, not
    encrypted) never carries the token itself, and a new token ends old sessions."""
    return hashlib.sha256(token.encode()).hexdigest()


def add_headers(response: flask.Response) -> flask.Response:
    for name, value in HEADERS.items():
        response.headers[name] = value
    return response


def csrf_token() -> str:
    """The session's CSRF token, made on first use."""
    token = flask.session.get(CSRF)
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        flask.session[CSRF] = token
    return token


def csrf_ok() -> bool:
    expected = flask.session.get(CSRF)
    given = flask.request.form.get(CSRF_FIELD, "")
    return isinstance(expected, str) and hmac.compare_digest(expected.encode(), given.encode())


def bearer_ok(token: str) -> bool:
    header = flask.request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def session_ok(token: str) -> bool:
    """Whether this request's session logged in with ``token`` and its login is live in
    the store (not logged out, not expired); the store is asked once a request."""
    held = flask.session.get(AUTH)
    if not isinstance(held, str) or not hmac.compare_digest(held.encode(), token_digest(token).encode()):
        return False
    if "login_live" not in flask.g:
        login = flask.session.get(LOGIN)
        flask.g.login_live = isinstance(login, str) and dashboard().store.login_live(login)
    return bool(flask.g.login_live)


def start_login(actor: str) -> None:
    """Make this request's session a new login as ``actor``: a new login in the store, a
    new CSRF token, nothing of the session before kept (its login ended)."""
    board = dashboard()
    assert board.token is not None
    login = board.store.start_login(board.session_lifetime)
    end_login()
    flask.session[LOGIN] = login
    flask.session[AUTH] = token_digest(board.token)
    flask.session[ACTOR] = actor
    flask.session.permanent = False  # the browser drops the cookie when it closes


def end_login() -> None:
    """End this request's session: its login in the store, and the cookie's contents."""
    login = flask.session.get(LOGIN)
    if isinstance(login, str):
        dashboard().store.end_login(login)
    flask.session.clear()
    flask.g.pop("login_live", None)


def authenticated(token: str | None) -> bool:
    """Whether this request carries the token (its session logged in with it, or a
    bearer header); never with no token configured."""
    return token is not None and (bearer_ok(token) or session_ok(token))


def refusal(token: str | None) -> tuple[int, str] | None:
    """Why this POST to an action must be refused (status and message), None when it may
    go on: read-only (403), no or a wrong token (401), a session's request without its
    CSRF token (403); a request with the bearer token needs none."""
    if token is None:
        return 403, "this dashboard is read-only: it was started without a token"
    if bearer_ok(token):
        return None
    if not session_ok(token):
        if flask.session.get(LOGIN) is not None:
            return 401, "this session's login has ended (logged out or expired): log in again to act"
        return 401, "log in with the dashboard's token (or send Authorization: Bearer) to act"
    if not csrf_ok():
        return 403, "the form's CSRF token is missing or wrong: reload the page and try again"
    return None


def actor_name() -> str:
    """Who an action is recorded as: the name given at login or in the form, else
    ``dashboard``."""
    given = flask.request.form.get("actor", "").strip() or flask.session.get(ACTOR) or "dashboard"
    return str(given)[:200]
