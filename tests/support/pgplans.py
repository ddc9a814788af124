"""Reading PostgreSQL plans in tests: a statement as the server receives it, and the
nodes of an EXPLAIN (FORMAT JSON) plan."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any


def numbered(query: str) -> tuple[str, list[str]]:
    """``query`` with psycopg's ``%(name)s`` placeholders as the ``$1, $2...`` psycopg
    sends to the server, and the parameter names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, query)
    assert "%" not in text, "a placeholder the conversion missed"
    return text, names


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node`` and every node under it."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
