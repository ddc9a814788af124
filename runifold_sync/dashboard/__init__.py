"""The operator dashboard: a WSGI app (Flask, the optional extra ``dashboard``) that shows
why work is stuck and lets an operator act on it.

``create_app(store, token=None)`` builds it; ``python -m runifold_sync dashboard`` serves
it with waitress. Pages are rendered on the server from Jinja templates with every stored
value escaped; there is no JavaScript and nothing is fetched from outside the app. With
no token the dashboard is read-only; with one, the actions (cancel, retry, pause,
resume, resolve, signal) need it: as a bearer header, or a login session with its CSRF
token (:mod:`.security`).

Importing ``runifold_sync`` never imports this package, so Flask is needed only here.
"""

from __future__ import annotations

try:
    import flask  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "runifold_sync.dashboard needs Flask; install the extra: pip install 'runifold_sync[dashboard]'"
    ) from exc

from .app import create_app

__all__ = ["create_app"]
