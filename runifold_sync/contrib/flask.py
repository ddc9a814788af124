"""Flask integration: a store per process, ``enqueue`` from views, and ``flask runifold run``.

.. code-block:: python

    runifold = Runifold()

    def create_app() -> Flask:
        app = Flask(__name__)
        app.config["RUNIFOLD_DATABASE_URL"] = "sqlite:///workflows.db"
        app.config["RUNIFOLD_APP"] = "myapp.workflows:registry"
        runifold.init_app(app)
        return app

    @bp.post("/orders")
    def create_order():
        task_id = runifold.enqueue("order-intake", 1, request.get_json())

Settings, read from ``app.config`` when ``init_app`` runs:

- ``RUNIFOLD_DATABASE_URL``: the store URL; default ``$RUNIFOLD_DATABASE_URL``, else a
  local SQLite file.
- ``RUNIFOLD_APP``: ``module:attribute`` of the ``WorkflowRegistry`` (or the registry
  itself); needed only by processes that run workers.
- ``RUNIFOLD_CONCURRENCY`` (1), ``RUNIFOLD_LEASE_SECONDS`` (30),
  ``RUNIFOLD_HEARTBEAT_SECONDS`` (a third of the lease; at most half), ``RUNIFOLD_CLAIM_BATCH`` (1),
  ``RUNIFOLD_RECYCLE_AFTER`` (tasks after which a pool worker is replaced; default never).

The store is opened on first use in each process and closed when the process exits, not
after each request. A process forked after the store was opened (gunicorn ``--preload``)
opens its own.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Unpack

import attrs
import click
from flask import Flask, current_app, has_app_context
from flask.cli import AppGroup

from ..errors import RunifoldError
from ..model.values import TaskOptions
from ..runner import (
    RunifoldSettings,
    default_worker_id,
    describe_report,
    once_succeeded,
    run_one_cycle,
    run_pool,
)
from ..store.base import WorkflowStore
from ._embedding import ProcessStore

__all__ = ["Runifold", "runifold_cli"]

_EXTENSION = "runifold"


@attrs.define
class _AppState:
    settings: RunifoldSettings
    stores: ProcessStore


class Runifold:
    """The Flask extension; ``Runifold(app)`` or ``Runifold()`` then ``init_app(app)``."""

    def __init__(self, app: Flask | None = None) -> None:
        self._app = app
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Check the ``RUNIFOLD_*`` settings (``InvalidArgument`` if one is wrong), and add
        the ``runifold`` command group to ``app.cli``."""
        state = _AppState(RunifoldSettings.from_mapping(app.config), ProcessStore())
        app.extensions[_EXTENSION] = state
        app.cli.add_command(runifold_cli)
        atexit.register(state.stores.close)  # closes only a store this process opened

    def _state(self) -> _AppState:
        if has_app_context():
            app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
        elif self._app is not None:
            app = self._app
        else:
            raise RuntimeError(
                "Runifold was used outside an application context; push one with app.app_context()"
            )
        return _state_of(app)

    @property
    def settings(self) -> RunifoldSettings:
        return self._state().settings

    @property
    def store(self) -> WorkflowStore:
        """This process's store for the current app, opened on first use."""
        state = self._state()
        return state.stores.get(state.settings.database_url)

    def enqueue(
        self,
        name: str,
        version: int,
        input: Any,
        *,
        connection: object = None,
        **options: Unpack[TaskOptions],
    ) -> str:
        """Enqueue a task now and return its id. Enqueue is idempotent on
        ``checkpoint_id``: pass one derived from your data (``f"order-{order.id}"``) and a
        retried request does not start a second workflow. With ``RUNIFOLD_APP`` set the
        task is checked first (an unknown name or version, input that does not fit:
        ``InvalidArgument`` naming it, nothing stored). With ``connection`` (the app's
        own psycopg 3 or sqlite3 connection to the store's database, or SQLAlchemy's
        ``connection.connection.driver_connection``) it is written in that connection's
        open transaction: it exists only if the request's transaction commits."""
        task = self.settings.task(name, version, input, **options)
        return self.store.enqueue(task, connection=connection).task_id

    def close(self) -> None:
        """Close the current app's store in this process (it reopens on next use); the
        extension does this itself when the process exits."""
        self._state().stores.close()


def _state_of(app: Flask) -> _AppState:
    try:
        state = app.extensions[_EXTENSION]
    except KeyError:
        raise RuntimeError(f"Runifold.init_app was not called for {app!r}") from None
    assert isinstance(state, _AppState)
    return state


runifold_cli = AppGroup("runifold", help="Run runifold workflow workers for this application.")


@runifold_cli.command("run")
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes.  [default: RUNIFOLD_CONCURRENCY, else 1]",
)
@click.option(
    "--worker-id",
    default=default_worker_id,
    help="Stable base id; pool workers are <base>-<slot>.  [default: host name]",
)
@click.option("--once", is_flag=True, help="Claim and run one task in this process, then exit (cron mode).")
def run_command(concurrency: int | None, worker_id: str, once: bool) -> None:
    """Run workers: a supervised pool of forked processes until SIGINT or SIGTERM, or
    with --once a single cycle whose exit status is 0 for idle, completed, suspended,
    retried or yielded (progress committed and the task requeued) and 1 for failed,
    lease lost, definition unavailable or cancelled. Store and registry come from
    RUNIFOLD_DATABASE_URL and RUNIFOLD_APP in the app's config."""
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    settings = _state_of(app).settings

    @contextmanager
    def cycle() -> Iterator[None]:
        with app.app_context():
            yield

    if once:
        with _click_errors():
            outcome = run_one_cycle(settings, worker_id, cycle)
        click.echo(repr(outcome))
        click.get_current_context().exit(0 if once_succeeded(outcome) else 1)
    with _click_errors():
        report = run_pool(settings, concurrency or settings.concurrency, worker_id, cycle)
    click.echo(describe_report(report))


@contextmanager
def _click_errors() -> Iterator[None]:
    try:
        yield
    except RunifoldError as exc:
        raise click.ClickException(str(exc)) from exc
