"""What every command of ``python -m runifold_sync`` shares: the ``--database`` and
``--json`` options, opening the store, and turning library errors into
``ClickException`` (here and nowhere else)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from .codec import NotJsonable, to_json
from .errors import RunifoldError
from .store.base import WorkflowStore
from .stores import ENV_VAR, default_url, open_store

database_option = click.option(
    "--database",
    metavar="URL",
    default=None,
    help=f"Store URL (sqlite:///path.db or postgresql://...); default ${ENV_VAR}, else a local SQLite file.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


@contextmanager
def opened_store(url: str | None) -> Iterator[WorkflowStore]:
    try:
        store = open_store(url or default_url())
    except RunifoldError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        yield store
    except RunifoldError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        store.close()


def canonical_json(text: str, option: str) -> str:
    """Strict JSON (no NaN or Infinity) in the canonical form the store compares."""
    try:
        return to_json(json.loads(text))
    except (json.JSONDecodeError, NotJsonable) as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from exc


def checked(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except RunifoldError as exc:
        raise click.ClickException(str(exc)) from exc


def echo_json(value: object, *, indent: int | None = 2) -> None:
    click.echo(json.dumps(value, indent=indent))
