"""What the commands of ``python -m runifold_sync`` share: the ``--database`` and
``--json`` options, choosing and opening the store, parsing a start time or a duration,
turning library errors into ``ClickException`` (here and nowhere else), and the group
that answers an error in JSON under ``--json``."""

from __future__ import annotations

import json
import os
import re
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import click

from ..errors import AppNotLoaded, InvalidArgument, RunifoldError
from ..model import validate
from ..model.codec import MAX_NESTING_DEPTH, NotJsonable, to_json
from ..store.base import WorkflowStore
from ..store.open import DEFAULT_URL, ENV_VAR, open_store, sqlite_path

database_option = click.option(
    "--database",
    metavar="URL",
    default=None,
    help=f"Store URL (sqlite:///path.db or postgresql://...); default ${ENV_VAR}, else "
    f"{DEFAULT_URL} (said on stderr).",
)
# Set in ``ctx.meta`` (shared by a command's context and its group's) by ``--json``, so
# the group can answer an error in JSON too (:class:`JsonErrorsGroup`).
_JSON_ERRORS = "runifold_sync.json_errors"
_VERBOSE = "runifold_sync.verbose"


def _remember_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """``--json``'s callback: note it for :class:`JsonErrorsGroup`. The option is eager
    (read before the others), so a bad value of another option is answered in JSON too."""
    if value:
        ctx.meta[_JSON_ERRORS] = True
    return value


json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    is_eager=True,
    callback=_remember_json,
    help='Print machine-readable JSON (an error as {"error": ..., "type": ...}).',
)


class JsonErrorsGroup(click.Group):
    """The top command group: a command run with ``--json`` that fails also prints
    ``{"error": message, "type": class name}`` on stdout, so a script reading stdout gets
    JSON whatever happens (before, it got nothing and had to parse stderr). The message
    on stderr and the exit status stay as click makes them. Done here, once for every
    command and subgroup, since every library error becomes a ``ClickException`` on its
    way out (:func:`checked`, :func:`opened_store`)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if ctx.meta.pop(_JSON_ERRORS, False):
                click.echo(json.dumps(error_json(exc)))
            raise


def error_json(exc: click.ClickException) -> dict[str, str]:
    """What ``--json`` prints for ``exc``: its message as click shows it, and the class
    of the library error behind it (``TaskNotFound``, ``InvalidArgument``...), else of
    the click error itself (``UsageError``, ``BadParameter``)."""
    cause = exc.__cause__
    error_type = type(cause if isinstance(cause, RunifoldError) else exc).__name__
    return {"error": exc.format_message(), "type": error_type}


def no_json_error(ctx: click.Context) -> None:
    """For a command that has already printed its JSON answer and then fails (``run``
    whose pool stopped): its stdout stays one JSON document."""
    ctx.meta.pop(_JSON_ERRORS, None)


def app_option(help: str, *, required: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--app MODULE:ATTR`` (the application's registry, passed as ``app_ref``); ``help``
    says what the command does with it. With it comes ``--verbose``, which adds the
    traceback to the one-line error of a module that raised on import."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option(
            "--verbose",
            is_flag=True,
            expose_value=False,
            callback=_remember_verbose,
            help="When --app cannot be loaded, print the traceback of what its import raised too.",
        )(command)
        return click.option(
            "--app", "app_ref", default=None, required=required, metavar="MODULE:ATTR", help=help
        )(command)

    return decorate


def _remember_verbose(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_VERBOSE] = True


class BadValue(click.ClickException):
    """An option's value that cannot be used: ``--app`` that cannot be loaded, JSON text
    or a file that cannot be read as one. A usage error (exit status 2), said in one line
    rather than under click's usage text."""

    exit_code = 2


def cli_error(exc: RunifoldError) -> click.ClickException:
    """The click error a library error becomes on its way out of a command (raise it
    ``from exc``). An application that could not be loaded is a usage error; with
    ``--verbose`` the traceback of what its import raised goes to stderr first."""
    if not isinstance(exc, AppNotLoaded):
        return click.ClickException(str(exc))
    context = click.get_current_context(silent=True)
    if context is not None and context.meta.get(_VERBOSE) and exc.__cause__ is not None:
        click.echo("".join(traceback.format_exception(exc.__cause__)).rstrip(), err=True)
    return BadValue(str(exc))


def operator_action(argument: str, who: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What every audited operator action on one task or schedule takes: its
    ``argument``, ``--actor`` and ``--reason`` (see :func:`audit_options`), ``--database``
    and ``--json``."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in (json_option, database_option, audit_options(who), click.argument(argument)):
            command = option(command)
        return command

    return decorate


def audit_options(who: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--actor`` and ``--reason`` of an operator action, both kept in the history;
    ``who`` completes the actor's help ("Who cancels it")."""

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option("--reason", required=True, help="Why (kept in the history).")(command)
        return click.option("--actor", required=True, help=f"Who {who} (kept in the history).")(command)

    return decorate


def store_url(database: str | None, *, reads_only: bool = False) -> str:
    """The store a command uses: ``--database``, else ``$RUNIFOLD_DATABASE_URL``, else the
    local default file. The default is said on stderr (stdout stays the command's own, so
    ``--json`` is unaffected): a command run from the wrong directory, or with the variable
    missing from a cron line, would otherwise enqueue into a new empty file unnoticed.
    Naming the store either way is what silences it. A command that only reads
    (``reads_only``) refuses a SQLite file that does not exist rather than make an empty
    store there (a mistyped path would otherwise answer "no tasks" and leave a file)."""
    url = database or os.environ.get(ENV_VAR)
    if url:
        if reads_only:
            _check_exists(url, "")
        return url
    path = os.path.abspath(sqlite_path(DEFAULT_URL))
    if reads_only:
        _check_exists(DEFAULT_URL, f"no --database and no ${ENV_VAR}, and ")
    doing = "using" if os.path.exists(path) else "creating"
    click.echo(
        f"runifold_sync: no --database and no ${ENV_VAR}: {doing} the SQLite store {path} "
        f"(name a store with either to silence this)",
        err=True,
    )
    return DEFAULT_URL


def _check_exists(url: str, preamble: str) -> None:
    """Refuse a ``sqlite:`` URL whose file does not exist (other stores are not files)."""
    if not url.lower().startswith("sqlite:"):
        return
    try:
        path = os.path.abspath(sqlite_path(url))
    except InvalidArgument as exc:
        raise cli_error(exc) from exc
    if not os.path.exists(path):
        refused = InvalidArgument(
            f"{preamble}no SQLite store at {path}: this command only reads a store, so it does not "
            "create one; check the path, or create the store with `migrate` (or `run`)"
        )
        raise cli_error(refused) from refused


@contextmanager
def opened_store(database: str | None, *, reads_only: bool = False) -> Iterator[WorkflowStore]:
    """The store a command uses (:func:`store_url`), closed when it is done; a library
    error raised inside becomes the command's error (:func:`cli_error`)."""
    try:
        store = open_store(store_url(database, reads_only=reads_only))
    except RunifoldError as exc:
        raise cli_error(exc) from exc
    try:
        yield store
    except RunifoldError as exc:
        raise cli_error(exc) from exc
    finally:
        store.close()


def parsed_json(text: str, option: str) -> Any:
    """The value of an option's JSON text; :class:`BadValue` naming ``option`` when it is
    not JSON, or is JSON Python's parser cannot take: nested past its recursion limit, an
    integer of more digits than it converts."""
    try:
        return json.loads(text)
    except RecursionError:
        raise BadValue(f"{option}: nests deeper than the {MAX_NESTING_DEPTH} levels a value may") from None
    except ValueError as exc:  # json.JSONDecodeError, and the integer digit limit
        if not isinstance(exc, json.JSONDecodeError) and "integer string conversion" in str(exc):
            raise BadValue(
                f"{option}: holds an integer of more than 4,300 digits, which JSON text cannot carry here"
            ) from None
        raise BadValue(f"{option}: not JSON: {exc}") from exc


def canonical_json(text: str, option: str) -> str:
    """Strict JSON (no NaN or Infinity) in the canonical form the store compares."""
    value = parsed_json(text, option)
    try:
        return to_json(value)
    except NotJsonable as exc:
        raise BadValue(f"{option}: not JSON: {exc}") from exc


def checked(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except RunifoldError as exc:
        raise cli_error(exc) from exc


def echo_json(value: object, *, indent: int | None = 2) -> None:
    click.echo(json.dumps(value, indent=indent))


# An amount and its unit, repeated: 30s, 5m, 1h30m, 1.5d.
_DELAY = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+")
_DELAY_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _delay(ctx: click.Context, param: click.Parameter, value: str) -> timedelta | None:
    """``value`` as a delay (``30s``, ``5m``, ``1h30m``, ``2d``), None when it is none."""
    text = value.strip()
    if not _DELAY.fullmatch(text):
        return None
    seconds = sum(float(n) * _UNIT_S[unit] for n, unit in _DELAY_PART.findall(text))
    if seconds > validate.MAX_DURATION.total_seconds():
        raise click.BadParameter(f"{value!r} is longer than {validate.MAX_DURATION.days} days", ctx, param)
    return timedelta(seconds=seconds)


def duration(ctx: click.Context, param: click.Parameter, value: str) -> timedelta:
    """A duration option such as ``wait --timeout``: ``30s``, ``5m``, ``1h30m``, ``2d``
    (``0s`` too). A click callback, so a bad value is a usage error naming it."""
    found = _delay(ctx, param, value)
    if found is None:
        raise click.BadParameter(f"{value!r} is not a duration (30s, 5m, 1h30m, 2d)", ctx, param)
    return found


def duration_text(value: timedelta) -> str:
    """``value`` as the duration options take it: ``30d``, ``12h``, ``1h30m``, ``45s``."""
    seconds = value.total_seconds()
    parts = []
    for unit in "dhm":
        amount, seconds = divmod(seconds, _UNIT_S[unit])
        if amount:
            parts.append(f"{amount:.0f}{unit}")
    if seconds or not parts:
        parts.append(f"{seconds:g}s")
    return "".join(parts)


def optional_duration(ctx: click.Context, param: click.Parameter, value: str | None) -> timedelta | None:
    """:func:`duration` for an option that may be left out (``run --retention``)."""
    return None if value is None else duration(ctx, param, value)


def start_time(ctx: click.Context, param: click.Parameter, value: str | None) -> datetime | timedelta | None:
    """``--not-before``: an ISO 8601 time with its UTC offset (a naive time would depend
    on the clock of whoever typed it), or a delay such as ``30s``, ``5m``, ``1h30m`` or
    ``2d``, which the command adds to store time (the clock every worker obeys), not to
    this host's. A click callback, so a bad value is a usage error naming it."""
    if value is None:
        return None
    delay = _delay(ctx, param, value)
    if delay is not None:
        return delay
    text = value.strip()
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is neither an ISO 8601 time (2026-12-24T09:00:00+01:00, or Z for UTC) "
            "nor a delay (30s, 5m, 1h30m, 2d)",
            ctx,
            param,
        ) from None
    if when.tzinfo is None:
        raise click.BadParameter(f"{value!r} has no UTC offset: add one (+01:00, or Z for UTC)", ctx, param)
    return when
