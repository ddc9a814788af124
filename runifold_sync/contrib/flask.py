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

Settings are read from ``app.config`` when ``init_app`` runs (``RUNIFOLD_*`` keys,
:class:`runifold_sync.Settings`): ``RUNIFOLD_DATABASE_URL`` (default
``$RUNIFOLD_DATABASE_URL``, else a local SQLite file), ``RUNIFOLD_APP``
(``module:attribute`` of the ``App`` or ``WorkflowRegistry`` whose workflows run, or the
registry itself; needed where workers run, and to check enqueues), ``RUNIFOLD_CONCURRENCY``,
``RUNIFOLD_LEASE_SECONDS``, ``RUNIFOLD_CLAIM_BATCH``, ``RUNIFOLD_TRACING`` and the rest.

The store is opened on first use in each process and closed when the process exits, not
after each request. A process forked after the store was opened (gunicorn ``--preload``)
opens its own.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Unpack

import click
from flask import Flask, current_app, has_app_context
from flask.cli import AppGroup

from ..app import App, once_succeeded
from ..errors import RunifoldError
from ..model.values import TaskOptions, WorkflowTask
from ..ops.tracing_env import env_tracer
from ..settings import Settings
from ..store.base import WorkflowStore

__all__ = ["Runifold", "runifold_cli"]

_EXTENSION = "runifold"


class Runifold:
    """The Flask extension; ``Runifold(app)`` or ``Runifold()`` then ``init_app(app)``."""

    def __init__(self, app: Flask | None = None) -> None:
        self._app = app
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Check the ``RUNIFOLD_*`` settings (``InvalidArgument`` if one is wrong), and add
        the ``runifold`` command group to ``app.cli``."""
        state = App(Settings.from_mapping(app.config))
        app.extensions[_EXTENSION] = state
        app.cli.add_command(runifold_cli)
        atexit.register(state.close)  # closes only a store this process opened

    def _state(self) -> App:
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
    def settings(self) -> Settings:
        return self._state().settings

    @property
    def store(self) -> WorkflowStore:
        """This process's store for the current app, opened on first use."""
        return self._state().store

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
        state = self._state()
        if state.settings.app is None:
            task = WorkflowTask.new(name, version, input, **options)
        else:
            task = state.registry.task(name, version, input, **options)
        return state.store.enqueue(task, connection=connection).task_id

    def close(self) -> None:
        """Close the current app's store in this process (it reopens on next use); the
        extension does this itself when the process exits."""
        self._state().close()


def _state_of(app: Flask) -> App:
    try:
        state = app.extensions[_EXTENSION]
    except KeyError:
        raise RuntimeError(f"Runifold.init_app was not called for {app!r}") from None
    assert isinstance(state, App)
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
    default=None,
    help="Stable base id; pool workers are <base>-<slot>.  [default: host name]",
)
@click.option("--once", is_flag=True, help="Claim and run one task in this process, then exit (cron mode).")
def run_command(concurrency: int | None, worker_id: str | None, once: bool) -> None:
    """Run workers: a supervised pool of forked processes until SIGINT or SIGTERM, or
    with --once a single cycle whose exit status is 0 for idle, completed, suspended,
    retried or yielded (progress committed and the task requeued) and 1 for failed,
    lease lost, definition unavailable or cancelled. Store and registry come from
    RUNIFOLD_DATABASE_URL and RUNIFOLD_APP in the app's config."""
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    settings = _state_of(app).settings
    with _click_errors():
        runner = App(settings, tracer=env_tracer() if settings.tracing else None, cycle=app.app_context)
        if once:
            try:
                outcome = runner.run_once(worker_id=worker_id)
            finally:
                runner.close()
        else:
            report = runner.run_pool(concurrency, worker_id=worker_id)
    if once:
        click.echo(repr(outcome))
        click.get_current_context().exit(0 if once_succeeded(outcome) else 1)
    click.echo(report.summary())


@contextmanager
def _click_errors() -> Iterator[None]:
    try:
        yield
    except RunifoldError as exc:
        raise click.ClickException(str(exc)) from exc
