"""Opening a store from a URL, as the CLI, the supervisor and applications do.

- ``sqlite:///relative/path.db`` (three slashes: a path relative to the working directory)
- ``sqlite:////absolute/path.db`` (four slashes: an absolute path)
- ``postgresql://user@host:5432/dbname?sslmode=require`` (``postgres://`` too), passed to
  libpq as it is, so every libpq URL parameter works. The database must be named (opening
  migrates it; libpq's default, the user's name, is refused), and what libpq would refuse
  without connecting (syntax, a port, ``sslmode``) is an :class:`InvalidArgument`.

Without a URL, ``RUNIFOLD_DATABASE_URL`` is used, else ``sqlite:///runifold-workflows.db``.
"""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from ..errors import InvalidArgument
from ..model import validate
from ..model.redaction import redacted
from .base import WorkflowStore
from .checks import MAX_PENDING_SIGNALS

ENV_VAR = "RUNIFOLD_DATABASE_URL"
DEFAULT_URL = "sqlite:///runifold-workflows.db"


def default_url() -> str:
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def sqlite_path(url: str) -> str:
    """The file path a ``sqlite:///`` URL names."""
    shape = "SQLite URL must look like sqlite:///relative.db or sqlite:////absolute/path.db"
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # brackets that make no IPv6 host
        raise InvalidArgument(f"{shape}, got {redacted(url)!r}: {exc}") from None
    if parts.scheme != "sqlite" or not url.startswith("sqlite:///"):
        raise InvalidArgument(f"{shape}, got {redacted(url)!r}")
    if parts.query or parts.fragment:
        raise InvalidArgument(f"SQLite URL {redacted(url)!r} must not have query parameters or a fragment")
    path = unquote(parts.path[1:])  # drop the slash that separates the empty host from the path
    if not path:
        raise InvalidArgument(f"SQLite URL {redacted(url)!r} names no file")
    return path


def open_store(url: str | None = None, *, max_pending_signals: int = MAX_PENDING_SIGNALS) -> WorkflowStore:
    """Open (and migrate) the store ``url`` names; see the module docstring for the forms.
    Unknown schemes raise :class:`InvalidArgument` naming the URL. ``max_pending_signals``
    caps the signals a task keeps unconsumed (more are refused)."""
    if url is None:
        url = default_url()
    validate.instance("store URL", url, str)
    scheme = url.partition(":")[0].lower() if "://" in url else ""
    if scheme == "sqlite":
        from .sqlite.store import SqliteWorkflowStore

        return SqliteWorkflowStore.open(sqlite_path(url), max_pending_signals=max_pending_signals)
    if scheme in ("postgresql", "postgres"):
        try:
            from .postgres.store import PostgresWorkflowStore
        except ImportError as exc:  # the optional dependency is missing
            raise InvalidArgument(
                f"store URL {redacted(url)!r} needs psycopg 3 and psycopg-pool: "
                "pip install 'runifold_sync[postgres]'"
            ) from exc
        return PostgresWorkflowStore.connect(url, max_pending_signals=max_pending_signals)
    raise InvalidArgument(
        f"unsupported store URL {redacted(url)!r}: use sqlite:///path.db, "
        "sqlite:////abs/path.db or postgresql://..."
    )
