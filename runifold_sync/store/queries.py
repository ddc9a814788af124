"""Named SQL queries kept in one ``.sql`` file per dialect, and ``common.sql`` for the
few both run as written.

A file is a sequence of blocks, each starting with a ``-- name: NAME`` line. The token
``{now}`` stands for the dialect's store-time expression, so every query reads time the
same way, and ``{query:NAME}`` stands for the text of query NAME, so a part that two
statements share (the claims' tenant admission and leasing) is written once.

A block named ``NAME@VARIANT`` is another text of part NAME: every query that includes
NAME, directly or through other parts, is also loaded as ``QUERY@VARIANT`` with that text
in its place (the claims ``@unflowed``: without their flow-control parts, for a store
where no flow limit is set).

Comment lines and indentation are dropped from the text sent: psycopg converts a
statement's placeholders once and keeps the result only for statements up to 4 KB, and
the claim, with its comments, was longer (converted anew on every claim).
"""

from __future__ import annotations

import re
from importlib import resources

from ..errors import SchemaTooNew

_HEADER = re.compile(r"^-- name: ([a-z_]+(?:@[a-z_]+)?)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{query:([a-z_]+)\}")


def load_queries(dialect: str, now_expression: str) -> dict[str, str]:
    """The queries of ``common.sql`` and of the dialect's own file, by name."""
    queries: dict[str, str] = {}
    for file in ("common", dialect):
        text = resources.files(__package__).joinpath(f"sql/{file}.sql").read_text()
        parts = _HEADER.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"query {name!r} is defined twice (again in {file}.sql)")
            queries[name] = _compact(body).rstrip(";").replace("{now}", now_expression)

    def expand(body: str, variant: str = "") -> str:  # a part may include parts of its own
        def include(part: re.Match[str]) -> str:
            name = part.group(1)
            return expand(queries.get(name + variant, queries[name]), variant)

        return _INCLUDE.sub(include, body)

    expanded = {name: expand(body) for name, body in queries.items() if "@" not in name}
    for variant in {name[name.index("@") :] for name in queries if "@" in name}:
        for name, body in queries.items():
            if "@" not in name and (text := expand(body, variant)) != expanded[name]:
                expanded[name + variant] = text
    return expanded


def _compact(body: str) -> str:
    """``body`` without its comment lines and each line's indentation."""
    lines = (line.strip() for line in body.splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def load_migrations(dialect: str) -> list[tuple[int, str]]:
    """Numbered migration scripts ``NNNN_description.sql`` in version order. A version's
    script is the dialect's own followed by ``common/NNNN_*.sql`` where there is one: the
    statements both dialects run as written (indexes, mostly), kept once."""
    common = dict(_scripts("common"))
    return [(version, script + "\n" + common.get(version, "")) for version, script in _scripts(dialect)]


def _scripts(folder_name: str) -> list[tuple[int, str]]:
    folder = resources.files(__package__).joinpath(f"migrations/{folder_name}")
    scripts = []
    for entry in folder.iterdir():
        match = re.fullmatch(r"(\d{4})_[a-z0-9_]+\.sql", entry.name)
        if match:
            scripts.append((int(match.group(1)), entry.read_text()))
    return sorted(scripts)


def pending_migrations(dialect: str, current: int, where: str) -> tuple[int, list[tuple[int, str]]]:
    """The latest schema version and the migrations a database at version ``current``
    lacks, in order. A database newer than this code (``where`` names it) raises
    :class:`SchemaTooNew`: an older runifold_sync must not write to it."""
    migrations = load_migrations(dialect)
    latest = migrations[-1][0]
    if current > latest:
        raise SchemaTooNew(
            f"{where} has schema version {current}; this runifold_sync knows up to {latest}. "
            "Upgrade runifold_sync."
        )
    return latest, [(version, script) for version, script in migrations if version > current]
