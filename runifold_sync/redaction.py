"""Connection strings made safe to print: every password replaced by ``***``.

Both forms a store accepts are covered: URLs (``postgresql://user:secret@host/db``, and a
``password=`` query parameter) and libpq ``key=value`` connection strings
(``host=db password=secret``, the value quoted or not). Anything that prints or logs a
connection string goes through :func:`redacted`.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit

MASK = "***"
_SECRET_KEYS = ("password", "sslpassword")
# key = value in a libpq connection string: a quoted value may hold escaped quotes.
_KEYS = "|".join(_SECRET_KEYS)
_CONNINFO_SECRET = re.compile(
    rf"(?P<key>\b(?:{_KEYS})\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^\s']+)", re.IGNORECASE
)


def redacted(connection: str) -> str:
    """``connection`` (a URL or a ``key=value`` string) with its passwords masked."""
    if "://" not in connection:
        return _CONNINFO_SECRET.sub(lambda m: f"{m['key']}{MASK}", connection)
    try:
        parts = urlsplit(connection)
        password = parts.password
    except ValueError:  # not a URL after all: mask what looks like a secret anyway
        return _CONNINFO_SECRET.sub(lambda m: f"{m['key']}{MASK}", connection)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    secret_query = any(key.lower() in _SECRET_KEYS for key, _ in pairs)
    if not password and not secret_query:
        return connection  # unchanged (a rebuilt sqlite:/// URL would lose its empty host)
    netloc = parts.netloc
    if password:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:{MASK}@{host}"
    query = parts.query
    if secret_query:
        query = urlencode([(k, MASK if k.lower() in _SECRET_KEYS else v) for k, v in pairs], safe="*")
    return parts._replace(netloc=netloc, query=query).geturl()


def secrets_of(connection: str) -> list[str]:
    """The passwords ``connection`` holds, to scrub from messages that may quote them
    (a driver's parse error can)."""
    found = [m["value"].strip("'") for m in _CONNINFO_SECRET.finditer(connection)]
    if "://" in connection:
        try:
            parts = urlsplit(connection)
            found += [parts.password or ""] + [
                v for k, v in parse_qsl(parts.query) if k.lower() in _SECRET_KEYS
            ]
        except ValueError:
            pass
    return [secret for secret in found if secret]


def scrubbed(message: str, connection: str) -> str:
    """``message`` with every password of ``connection`` masked."""
    for secret in secrets_of(connection):
        message = message.replace(secret, MASK)
    return message
