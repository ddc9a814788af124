"""The operator dashboard in a Django URLconf:

.. code-block:: python

    # urls.py
    from runifold_sync.contrib.django.dashboard import dashboard_urls

    urlpatterns = [path("ops/", include(dashboard_urls(token=os.environ.get("OPS_TOKEN"))))]

Every request under the prefix is handed to the dashboard's WSGI app
(:func:`runifold_sync.dashboard.create_app`) over this process's store
(:func:`~runifold_sync.contrib.django.get_store`), with the prefix as its
``SCRIPT_NAME`` so its links stay under it. The dashboard checks its own token and CSRF
token, so the view is exempt from Django's CSRF middleware (whose token its forms do not
carry). Its session cookie is signed with a key derived from Django's ``SECRET_KEY``, so
a login holds across the processes of a Django server. Needs the ``dashboard`` extra.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings  # type: ignore[import-untyped]
from django.http import HttpRequest, HttpResponse  # type: ignore[import-untyped]
from django.urls import re_path  # type: ignore[import-untyped]
from django.views.decorators.csrf import csrf_exempt  # type: ignore[import-untyped]

from ...store.base import WorkflowStore
from . import get_store

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


class _Mounted:
    """The dashboard app of the current store, made on first use and again when the
    store changes (a forked process opens its own)."""

    def __init__(self, token: str | None) -> None:
        self._token = token
        self._lock = threading.Lock()
        self._for: WorkflowStore | None = None
        self._app: WsgiApp | None = None

    def app(self) -> WsgiApp:
        from ...dashboard import create_app

        store = get_store()
        with self._lock:
            if self._app is None or self._for is not store:
                key = hashlib.sha256(f"runifold_sync dashboard:{settings.SECRET_KEY}".encode()).digest()
                self._app, self._for = create_app(store, token=self._token, secret_key=key), store
            return self._app


def dashboard_urls(*, token: str | None = None) -> list[Any]:
    """URL patterns serving the dashboard under the prefix they are included at; with
    no ``token`` it is read-only."""
    mounted = _Mounted(token)

    def dashboard(request: HttpRequest, path: str) -> HttpResponse:
        return call_wsgi(mounted.app(), request, path)

    return [re_path(r"^(?P<path>.*)$", csrf_exempt(dashboard), name="runifold-dashboard")]


def call_wsgi(app: WsgiApp, request: HttpRequest, path: str) -> HttpResponse:
    """Answer ``request`` with the WSGI ``app`` mounted where ``path`` (the rest of the
    URL after the include's prefix) starts."""
    body = request.body
    environ = dict(request.environ)
    inner = "/" + path
    mount = request.path_info[: len(request.path_info) - len(path)].rstrip("/")
    # WSGI carries paths as UTF-8 bytes decoded as latin-1; Django's are decoded text.
    environ["SCRIPT_NAME"] = (request.META.get("SCRIPT_NAME", "") + mount).encode().decode("latin-1")
    environ["PATH_INFO"] = inner.encode().decode("latin-1")
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    started: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started["status"], started["headers"] = status, headers
        return lambda data: None

    result = app(environ, start_response)
    try:
        content = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    response = HttpResponse(content, status=int(started["status"].split(" ", 1)[0]))
    for name, value in started["headers"]:
        if name.lower() == "set-cookie":
            response.cookies.load(value)
        else:
            response[name] = value
    return response
