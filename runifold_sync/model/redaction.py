"""Connection strings made safe to print: every password replaced by ``***``.

Both forms a store accepts are covered: URLs (``postgresql://user:secret@host/db``, and a
``password=`` query parameter) and libpq ``key=value`` connection strings
(``host=db password=secret``, the value quoted or not). Anything that prints or logs a
connection string goes through :func:`redacted`.

The password is found the way libpq could read it, not the way ``urllib`` does: libpq
takes ``?``, ``#``, ``[`` and ``]`` in a URL's password as they are, where ``urlsplit``
cuts the URL at them (and so found no password, and printed it whole). A URL's password
is taken to run from the first ``:`` after the scheme to the last ``@``, which covers
both readings of a password holding ``@`` (libpq's ends at the first one): where the
two differ, more is masked, never less.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"
_SECRET_KEYS = ("password", "sslpassword")
_KEYS = "|".join(_SECRET_KEYS)
# key = value in a libpq connection string. A quoted value may hold escaped quotes, and
# one never closed runs to the end; an unquoted one runs to the next space not escaped,
# and on over further words that are not themselves "key=" (a password with a space the
# user forgot to quote, which libpq then quotes back in its error).
_CONNINFO_SECRET = re.compile(
    rf"(?P<key>\b(?:{_KEYS})\s*=\s*)"
    r"(?P<value>'(?:[^'\\]|\\.)*(?:'|$)|(?:\\.|[^\s\\])+(?:\s+(?![\w.-]+\s*=)(?:\\.|[^\s\\])+)*)",
    re.IGNORECASE,
)
_QUERY_SECRET = re.compile(rf"[?&](?:{_KEYS})=(?P<value>[^&#]*)", re.IGNORECASE)
# Pieces of a password shorter than this are not scrubbed from messages on their own:
# masking every "a" in a message would hide more than it protects.
_SHORTEST_PIECE = 4


def _secret_spans(connection: str) -> list[tuple[int, int]]:
    """Where the passwords of ``connection`` stand in it, as (start, end), in order."""
    if "://" not in connection:
        return [m.span("value") for m in _CONNINFO_SECRET.finditer(connection)]
    after_scheme = connection.index("://") + 3
    spans = []
    at = connection.rfind("@", after_scheme)
    if at >= 0:
        colon = connection.find(":", after_scheme, at)
        if colon >= 0 and colon + 1 < at:
            spans.append((colon + 1, at))
    spans += [m.span("value") for m in _QUERY_SECRET.finditer(connection, max(at, after_scheme))]
    return [(start, end) for start, end in spans if end > start]


def redacted(connection: str) -> str:
    """``connection`` (a URL or a ``key=value`` string) with its passwords masked."""
    shown = connection
    for start, end in reversed(_secret_spans(connection)):
        shown = shown[:start] + MASK + shown[end:]
    return shown


def secrets_of(connection: str) -> list[str]:
    """The passwords ``connection`` holds, to scrub from messages that may quote them (a
    driver's parse error can): each as written, decoded, and its pieces between ``@``
    (what libpq took for host and port after the first one) or spaces (the words of an
    unquoted password, which libpq quotes back one by one)."""
    found: set[str] = set()
    for start, end in _secret_spans(connection):
        written = connection[start:end]
        for secret in (written, unquote(written), written.strip("'")):
            found.add(secret)
            found.update(piece for piece in re.split(r"[@\s]+", secret) if len(piece) >= _SHORTEST_PIECE)
    return sorted((secret for secret in found if secret), key=len, reverse=True)  # longest first


def scrubbed(message: str, connection: str) -> str:
    """``message`` with every password of ``connection`` masked."""
    for secret in secrets_of(connection):
        message = message.replace(secret, MASK)
    return message
