"""Serving the dashboard with waitress (a production WSGI server, not Flask's
development one), in the foreground for the CLI or on a thread for tests and tools."""

from __future__ import annotations

import threading
from typing import Any

import attrs
import flask

try:
    from waitress.server import create_server
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "serving the dashboard needs waitress; install the extra: pip install 'runifold_sync[dashboard]'"
    ) from exc

# Requests served at once; the store's reads are short, and SQLite serializes writes.
THREADS = 4


def make_server(app: flask.Flask, host: str, port: int) -> Any:
    """A waitress server for ``app`` bound to ``host``:``port`` (0: a free port), not
    yet serving; its ``effective_port`` is the port it bound."""
    return create_server(app, host=host, port=port, threads=THREADS, ident="runifold_sync")


def url_of(server: Any) -> str:
    host = server.effective_host
    return f"http://{f'[{host}]' if ':' in host else host}:{server.effective_port}/"


@attrs.define
class Background:
    """A server running on a named daemon thread; :meth:`stop` ends it."""

    server: Any
    thread: threading.Thread

    @property
    def url(self) -> str:
        return url_of(self.server)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.close()
        self.server.task_dispatcher.shutdown()
        self.thread.join(timeout_s)


def serve_in_background(app: flask.Flask, host: str = "127.0.0.1", port: int = 0) -> Background:
    server = make_server(app, host, port)
    thread = threading.Thread(target=_run, args=(server,), name="runifold-dashboard", daemon=True)
    thread.start()
    return Background(server, thread)


def _run(server: Any) -> None:
    try:
        server.run()
    except OSError:  # the socket closed under the loop by stop()
        pass
