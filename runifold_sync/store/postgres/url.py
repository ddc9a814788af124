"""What a PostgreSQL store URL says beyond libpq: whether a transaction-pooling PgBouncer
stands between the store and the server, and where to LISTEN around it.

PgBouncer in transaction mode hands each transaction to any server connection, so
nothing may outlive one: no server-side prepared statement (psycopg prepares a query
after five executions, and the next transaction may land on a server that never saw
it), no session setting, and no LISTEN (a notification goes to whichever client holds
that server next). Three URL parameters, taken out before the URL reaches libpq:

- ``pgbouncer=true``: a transaction-mode pooler is in the path. Statements are never
  prepared and the session is never configured.
- ``listen_host=H`` and ``listen_port=P``: where idle workers LISTEN, on a connection of
  their own straight to the server (the rest of the URL, user and database included, is
  kept). Without them, idle workers poll the store every :data:`POLL_INTERVAL_S`.

Session-mode pooling needs none of this: a session keeps its server connection.

What can be checked without connecting is checked here, so a mistake in the URL is an
:class:`InvalidArgument` naming it rather than an outage (:class:`StoreUnavailable`,
which a worker waits out): libpq's own syntax, the database name, which opening migrates
and so must be named rather than left to libpq's default (the user's name), each port
number, and ``sslmode``. A URL that passes may still fail to connect: that is an outage.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

import attrs
import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from ...errors import InvalidArgument
from ...model import validate
from ...model.redaction import redacted, scrubbed

PARAMETERS = ("pgbouncer", "listen_host", "listen_port")
# How often an idle worker behind a transaction pooler looks for work when it has no
# direct connection to LISTEN on: the longest it can take to see a new task.
POLL_INTERVAL_S = 0.5
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
# libpq's sslmode values (https://www.postgresql.org/docs/current/libpq-ssl.html).
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")


def _masked(conninfo: str | None) -> str:
    return repr(None if conninfo is None else redacted(conninfo))


@attrs.frozen
class PostgresTarget:
    """Where the store connects (``conninfo``, as libpq takes it), whether a transaction
    pooler is on that path, and the direct connection for LISTEN when one is given."""

    conninfo: str = attrs.field(repr=_masked)
    pgbouncer: bool = False
    listen_conninfo: str | None = attrs.field(default=None, repr=_masked)

    @property
    def polls(self) -> bool:
        """Idle workers poll: behind a transaction pooler with nowhere else to LISTEN."""
        return self.pgbouncer and self.listen_conninfo is None


def parse_target(url: str) -> PostgresTarget:
    """Split ``url`` into libpq's part and ours. A ``key=value`` connection string has no
    place for our parameters and goes to libpq unchanged."""
    if "://" not in url:
        return PostgresTarget(check_conninfo(url, url))
    base, query = _split_query(url)
    pairs = parse_qsl(query, keep_blank_values=True)
    ours = {key: value for key, value in pairs if key in PARAMETERS}
    if not ours:
        return PostgresTarget(check_conninfo(url, url))
    rest = urlencode([(k, v) for k, v in pairs if k not in PARAMETERS])
    conninfo = f"{base}?{rest}" if rest else base
    check_conninfo(url, conninfo)
    pgbouncer = _flag(url, ours.get("pgbouncer", "false"))
    listen = {key.removeprefix("listen_"): value for key, value in ours.items() if key.startswith("listen_")}
    if listen and not pgbouncer:
        raise InvalidArgument(
            f"store URL {redacted(url)!r}: listen_host and listen_port name the direct connection "
            "that bypasses a transaction pooler; they need pgbouncer=true"
        )
    if "port" in listen:
        try:
            port = int(listen["port"])
        except ValueError:
            raise InvalidArgument(
                f"store URL {redacted(url)!r}: listen_port must be a port number, got {listen['port']!r}"
            ) from None
        validate.integer("listen_port", port, minimum=1, maximum=65535)
    return PostgresTarget(conninfo, pgbouncer, make_conninfo(conninfo, **listen) if listen else None)


def _split_query(url: str) -> tuple[str, str]:
    """``url`` before its query, and the query, found as libpq finds them: after the
    user's part, which ends at the last ``@`` before the path. ``urlsplit`` takes a ``?``
    or ``#`` in the password for the query's or the fragment's start, and a ``[`` for an
    IPv6 host, where libpq reads them as the password's."""
    after_scheme = url.index("://") + 3
    path = url.find("/", after_scheme)
    at = url.rfind("@", after_scheme, len(url) if path < 0 else path)
    start = url.find("?", after_scheme if at < 0 else at)
    return (url, "") if start < 0 else (url[:start], url[start + 1 :])


def check_conninfo(url: str, conninfo: str) -> str:
    """``conninfo`` (libpq's part of ``url``), refused naming ``url`` with its passwords
    masked where libpq would refuse it or where it names no database. Without a database
    name libpq picks the user's name, and opening the store would create its tables in a
    database nobody named. (``PGDATABASE`` is not consulted: the URL must say it.)"""
    try:
        options = conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        raise InvalidArgument(
            f"invalid PostgreSQL URL or connection string {redacted(url)!r}: {scrubbed(str(exc), url)}"
        ) from exc
    if not options.get("dbname"):
        example = "postgresql://user@host:5432/dbname" if "://" in url else "dbname=NAME"
        raise InvalidArgument(
            f"store URL {redacted(url)!r} names no database: libpq would fall back to the user's "
            f"name and the store would create its tables there; name it ({example})"
        )
    for port in str(options.get("port") or "").split(","):  # one per host; empty: the default
        number = port.strip()
        if number and not (number.isascii() and number.isdigit() and 1 <= int(number) <= 65535):
            validate.refuse(f"store URL {redacted(url)!r}: port", "a number in 1..65535", port)
    sslmode = options.get("sslmode")
    if sslmode is not None and str(sslmode) not in SSLMODES:
        raise InvalidArgument(
            f"store URL {redacted(url)!r}: sslmode must be one of {', '.join(SSLMODES)}, "
            f"got {validate.shown(sslmode)}"
        )
    return conninfo


def _flag(url: str, value: str) -> bool:
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    validate.refuse(f"store URL {redacted(url)!r}: pgbouncer", "true or false", value)
