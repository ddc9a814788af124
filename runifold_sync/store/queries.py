"""Named SQL queries kept in one ``.sql`` file per dialect.

A file is a sequence of blocks, each starting with a ``-- name: NAME`` line. The token
``{now}`` stands for the dialect's store-time expression, so every query reads time the
same way.
"""

from __future__ import annotations

import re
from importlib import resources

from ..errors import SchemaTooNew

_HEADER = re.compile(r"^-- name: ([a-z_]+)\s*$", re.MULTILINE)


def load_queries(dialect: str, now_expression: str) -> dict[str, str]:
    text = resources.files(__package__).joinpath(f"sql/{dialect}.sql").read_text()
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"query {name!r} is defined twice in {dialect}.sql")
        queries[name] = body.strip().rstrip(";").replace("{now}", now_expression)
    return queries


def load_migrations(dialect: str) -> list[tuple[int, str]]:
    """Numbered migration scripts ``NNNN_description.sql`` in version order."""
    folder = resources.files(__package__).joinpath(f"migrations/{dialect}")
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
