"""``dashboard``: serve the operator dashboard (:mod:`runifold_sync.dashboard`) over the
store with waitress until interrupted. Flask and waitress are imported only here, when
the command runs, so the rest of the CLI works without the ``dashboard`` extra."""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path

import click

from ..app import load_registry
from ..store.checks import DEFAULT_LOGIN_LIFETIME
from .common import (
    app_option,
    checked,
    database_option,
    duration,
    duration_text,
    echo_json,
    json_option,
    opened_store,
)


def _token(token_file: Path | None) -> str | None:
    """The token in ``token_file`` (its first line, stripped), None without a file. The
    token itself is never printed, not even in an error."""
    if token_file is None:
        return None
    try:
        text = token_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {token_file}: {exc}", param_hint="--token-file") from exc
    lines = text.splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise click.BadParameter(
            f"{token_file} holds no token (its first line is empty)", param_hint="--token-file"
        )
    return token


def _lifetime(ctx: click.Context, param: click.Parameter, value: str) -> timedelta:
    found = duration(ctx, param, value)
    if found <= timedelta(0):
        raise click.BadParameter(f"{value!r} must be longer than 0s", ctx, param)
    return found


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8321, show_default=True, help="Port (0: any free one)."
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File whose first line is the token that actions need; without it the dashboard is read-only.",
)
@click.option(
    "--session-lifetime",
    default=duration_text(DEFAULT_LOGIN_LIFETIME),
    show_default=True,
    callback=_lifetime,
    help="How long a login lasts (30m, 8h, 1d); logging out ends it sooner.",
)
@app_option("The workflow registry, so task pages show usage against each definition's budget.")
@database_option
@json_option
def dashboard(
    host: str,
    port: int,
    token_file: Path | None,
    session_lifetime: timedelta,
    app_ref: str | None,
    database: str | None,
    as_json: bool,
) -> None:
    """Serve the operator dashboard (needs the 'dashboard' extra) until interrupted.

    With --json, prints one line {"url": ..., "read_only": ...} once it listens."""
    token = _token(token_file)
    registry = None if app_ref is None else checked(load_registry, app_ref)
    try:
        from ..dashboard import create_app
        from ..dashboard.serving import make_server, url_of
    except ImportError as exc:
        raise click.ClickException(str(exc)) from exc
    with opened_store(database, reads_only=True) as store:
        try:
            app = create_app(store, token=token, registry=registry, session_lifetime=session_lifetime)
            server = make_server(app, host, port)
        except OSError as exc:
            raise click.ClickException(f"cannot listen on {host}:{port}: {exc}") from exc
        url = url_of(server)
        if as_json:
            echo_json({"url": url, "read_only": token is None}, indent=None)
        else:
            mode = "read-only (no --token-file)" if token is None else "actions need the token"
            click.echo(f"runifold_sync dashboard at {url}, {mode}; Ctrl-C stops it")
        if token is not None and not _loopback(host):
            click.echo(
                f"warning: listening on {host} over plain HTTP: the token and session cookie cross the "
                "network unencrypted; put a TLS proxy in front",
                err=True,
            )
        try:
            server.run()
        except KeyboardInterrupt:
            pass
        finally:
            server.close()
