"""``manage.py runworkflows``: run workflow workers for this Django project."""

from __future__ import annotations

from argparse import ArgumentParser
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.core.management.base import BaseCommand, CommandError  # type: ignore[import-untyped]
from django.db import close_old_connections, connections  # type: ignore[import-untyped]

from runifold_sync.app import App, once_succeeded
from runifold_sync.contrib.django import runifold_settings, store_preparation
from runifold_sync.errors import RunifoldError
from runifold_sync.ops.tracing_env import env_tracer

from .....model import validate


@contextmanager
def _fresh_connections() -> Iterator[None]:
    """What a request does for Django's connections, around each cycle of a long-lived
    worker: drop connections that broke or outlived CONN_MAX_AGE."""
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


class Command(BaseCommand):  # type: ignore[misc]
    help = (
        "Run runifold workflow workers: a supervised pool of forked worker processes until "
        "SIGINT or SIGTERM, or with --once a single claim-and-run cycle (cron mode) that "
        "exits 0 for idle, completed, suspended, retried or yielded (progress committed and "
        "the task requeued) and 1 for failed, lease lost, definition unavailable or cancelled. "
        "The store and registry come from RUNIFOLD_DATABASE_URL and RUNIFOLD_APP."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--concurrency",
            type=int,
            default=None,
            help="Worker processes (default: RUNIFOLD_CONCURRENCY, else 1).",
        )
        parser.add_argument(
            "--once", action="store_true", help="Claim and run one task in this process, then exit."
        )
        parser.add_argument(
            "--worker-id",
            default=None,
            help="Stable base id; pool workers are <base>-<slot> (default: the host name).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        concurrency: int | None = options["concurrency"]
        worker_id: str | None = options["worker_id"]
        try:
            if concurrency is not None:
                validate.count("--concurrency", concurrency)
            settings = runifold_settings()
            tracer = env_tracer() if settings.tracing else None
            if options["once"]:
                # In this process, inside whatever transaction the caller holds (a test's):
                # Django's connections are left alone.
                app = App(settings, tracer=tracer, prepare=store_preparation())
                try:
                    outcome = app.run_once(worker_id=worker_id)
                finally:
                    app.close()
                self.stdout.write(repr(outcome))
                if not once_succeeded(outcome):
                    raise CommandError(f"worker cycle ended with {outcome.kind}", returncode=1)
                return
            # Children must not share the parent's database sockets: close them before the
            # fork; each child opens its own on first use.
            connections.close_all()
            app = App(settings, tracer=tracer, cycle=_fresh_connections, prepare=store_preparation())
            report = app.run_pool(concurrency, worker_id=worker_id)
        except RunifoldError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(report.summary())
