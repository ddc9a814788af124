"""The commands that run workflows: ``run`` (a supervised pool, or one cycle for cron)
and ``demo`` (a pool recovering from a worker killed mid-step)."""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import attrs
import click

from ..app import App, load_app, once_succeeded
from ..engine.logs import LogFormat, configure_logging
from ..errors import InvalidArgument, RunifoldError
from ..model import validate
from ..model.outcomes import RunOutcome
from ..model.redaction import redacted
from ..ops.metrics_endpoint import MetricsEndpoint, serving_metrics
from ..ops.tracing_env import env_tracer
from ..pool.retention import RetentionPolicy
from ..pool.retention_process import pruning_beside
from ..pool.supervisor import check_base_id
from ..settings import Settings
from ..worker.idle_backoff import DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF
from ..worker.settings import AUTO, MAX_CLAIM_BATCH
from .common import (
    app_option,
    checked,
    cli_error,
    database_option,
    echo_json,
    json_option,
    no_json_error,
    optional_duration,
    store_url,
)

if TYPE_CHECKING:
    from .demo import DemoRow

DEMO_URL = "sqlite:///runifold-demo.db"
MIN_LEASE_S = 0.1  # the shortest lease and heartbeat an operator may ask for
MIN_HEARTBEAT_S = 0.05


def _one_queue_each(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    """A comma in a name given as ``--queue`` is refused: it would name one queue there
    and two in ``$RUNIFOLD_QUEUES``."""
    for name in value:
        if "," in name:
            raise click.BadParameter(
                f"{name!r}: one queue name each, repeated for more (--queue gpu --queue default)",
                ctx,
                param,
            )
    return value


class _ClaimBatch(click.ParamType[int | str, Any]):
    """``auto`` or a number of tasks in 1..MAX_CLAIM_BATCH."""

    name = "auto|N"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        if value == AUTO:
            return AUTO
        return click.IntRange(1, MAX_CLAIM_BATCH).convert(value, param, ctx)


def _var(key: str) -> str:
    return f"  [env var: {key}]"


@click.command()
@app_option("The application's App or WorkflowRegistry.", required=True)
@database_option
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes.  [default: 1]" + _var("RUNIFOLD_CONCURRENCY"),
)
@click.option(
    "--worker-id",
    default=None,
    help="Stable base id; pool workers are <base>-<slot>.  [default: host name]",
)
@click.option(
    "--lease",
    "lease_s",
    type=float,
    default=None,
    help="Lease seconds.  [default: 30]" + _var("RUNIFOLD_LEASE_SECONDS"),
)
@click.option(
    "--heartbeat",
    "heartbeat_s",
    type=float,
    default=None,
    help="Heartbeat interval seconds (at most half the lease).  [default: a third of the lease]"
    + _var("RUNIFOLD_HEARTBEAT_SECONDS"),
)
@click.option(
    "--claim-batch",
    type=_ClaimBatch(),
    default=None,
    metavar="auto|N",
    help="Tasks each worker claims at once and runs in turn (their leases kept alive; "
    "handed back if the task before them runs over half a lease). 'auto' claims one task "
    "at a time, and up to 10 while the queue is deep and tasks are short; a number claims "
    "that many every time (1 keeps claims fairest across tenants).  [default: auto]"
    + _var("RUNIFOLD_CLAIM_BATCH"),
)
@click.option(
    "--recycle-after",
    type=click.IntRange(min=1),
    default=None,
    metavar="TASKS",
    help="Replace each pool worker with a fresh process in its slot after it has run this "
    "many tasks (bounds slow leaks in application code). Default: never." + _var("RUNIFOLD_RECYCLE_AFTER"),
)
@click.option(
    "--shutdown-grace",
    "shutdown_grace_s",
    type=click.FloatRange(min=0.1),
    default=None,
    metavar="SECONDS",
    help="After SIGTERM or SIGINT, how long each worker may take to finish its cycle before it is "
    "killed (a step stuck in a body cannot be interrupted); its task is claimed again once its "
    "lease runs out.  [default: 60]" + _var("RUNIFOLD_SHUTDOWN_GRACE_SECONDS"),
)
@click.option(
    "--max-backoff",
    "max_backoff_s",
    type=click.FloatRange(min=DEFAULT_MIN_BACKOFF.total_seconds()),
    default=None,
    metavar="SECONDS",
    help="The longest an idle worker waits before it looks for work again (PostgreSQL wakes "
    "it at once on new work), and how long it waits after a cycle failed on the store.  "
    f"[default: {DEFAULT_MAX_BACKOFF.total_seconds():g}]" + _var("RUNIFOLD_MAX_BACKOFF_SECONDS"),
)
@click.option(
    "--queue",
    "queues",
    multiple=True,
    metavar="NAME",
    callback=_one_queue_each,
    help="A named queue the workers claim from (repeatable; default: default). Without it, "
    'RUNIFOLD_QUEUES names them, comma-separated ("gpu,default").' + _var("RUNIFOLD_QUEUES"),
)
@click.option("--once", is_flag=True, help="Claim and run one task, then exit (cron mode).")
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    metavar="PORT",
    help="Serve the pool's Prometheus metrics at http://HOST:PORT/metrics from an exporter "
    "process of its own (not with --once).",
)
@click.option(
    "--metrics-host", default="127.0.0.1", show_default=True, help="Address the metrics endpoint listens on."
)
@click.option(
    "--retention",
    default=None,
    metavar="DURATION",
    callback=optional_duration,
    help="Prune finished tasks last changed longer ago than this (30d, 12h, 90m, 45s) while "
    "the pool runs, from a process of its own at a low rate (not with --once), started again "
    "(after 1 s, doubling to 60 s) if it dies. Default: keep every task.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default="info",
    show_default=True,
    help="Least severe log level written to stderr.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Log lines with task_id, worker_id and fencing_token fields: text, or one JSON object per line.",
)
@click.option(
    "--tracing",
    is_flag=True,
    default=None,
    help="Trace cycles, steps, effects and waits with OpenTelemetry (the otel extra): each worker "
    "process builds its own provider after the fork from the standard OTEL_* variables "
    "(OTEL_TRACES_EXPORTER: default otlp, OTLP over HTTP from the extra, to "
    "http://localhost:4318 unless OTEL_EXPORTER_OTLP_ENDPOINT says otherwise; over gRPC with "
    "OTEL_EXPORTER_OTLP_PROTOCOL=grpc and opentelemetry-exporter-otlp-proto-grpc installed; "
    "console; none; OTEL_SERVICE_NAME). An exporter not installed is refused before any "
    "worker starts." + _var("RUNIFOLD_TRACING"),
)
@json_option
def run(
    app_ref: str,
    database: str | None,
    concurrency: int | None,
    worker_id: str | None,
    lease_s: float | None,
    heartbeat_s: float | None,
    claim_batch: int | str | None,
    recycle_after: int | None,
    shutdown_grace_s: float | None,
    max_backoff_s: float | None,
    queues: tuple[str, ...],
    once: bool,
    metrics_port: int | None,
    metrics_host: str,
    retention: timedelta | None,
    log_level: str,
    log_format: LogFormat,
    tracing: bool | None,
    as_json: bool,
) -> None:
    """Run workers: a supervised pool of processes, or with --once a single cycle whose
    exit status is 0 for idle, completed, suspended, retried or yielded (a per-claim step
    limit reached: progress committed and the task requeued) and 1 for failed, lease
    lost, definition unavailable or cancelled. A pool exits 1 when its store refuses
    writes (permissions, a read-only database) five times in a row, naming why.

    The settings are the App's (when --app names one), then every RUNIFOLD_* variable
    set (RUNIFOLD_DATABASE_URL, RUNIFOLD_CONCURRENCY, RUNIFOLD_LEASE_SECONDS, ...), then
    the options given."""
    if once and metrics_port is not None:
        raise click.UsageError(
            "--metrics-port serves a running pool's metrics and cannot be used with --once"
        )
    if once and retention is not None:
        raise click.UsageError("--retention prunes beside a running pool and cannot be used with --once")
    configure_logging(log_level, log_format)
    for option, seconds, minimum_s in (
        ("--lease", lease_s, MIN_LEASE_S),
        ("--heartbeat", heartbeat_s, MIN_HEARTBEAT_S),
    ):
        if seconds is not None:  # named as given, before the settings name their variable
            checked(validate.seconds, option, seconds, minimum_s=minimum_s)
    target = checked(load_app, app_ref)
    base = target.settings if isinstance(target, App) else Settings()
    try:
        from_env = Settings.from_env(base=base)
    except InvalidArgument as exc:
        raise click.UsageError(str(exc)) from exc
    if database is None and not isinstance(target, App):
        database = store_url(None)  # the default store said on stderr when no variable names one
    settings = checked(
        Settings.from_mapping,
        {
            "RUNIFOLD_DATABASE_URL": database,
            "RUNIFOLD_CONCURRENCY": concurrency,
            "RUNIFOLD_LEASE_SECONDS": lease_s,
            "RUNIFOLD_HEARTBEAT_SECONDS": heartbeat_s,
            "RUNIFOLD_CLAIM_BATCH": claim_batch,
            "RUNIFOLD_RECYCLE_AFTER": recycle_after,
            "RUNIFOLD_SHUTDOWN_GRACE_SECONDS": shutdown_grace_s,
            "RUNIFOLD_MAX_BACKOFF_SECONDS": max_backoff_s,
            "RUNIFOLD_TRACING": tracing,
            "RUNIFOLD_QUEUES": list(queues) or None,
        },
        base=from_env,
    )
    tracer = target.tracer if isinstance(target, App) else None
    if settings.tracing:
        try:  # refused before a worker is forked or the --once cycle claims
            tracer = env_tracer()
        except InvalidArgument as exc:
            raise click.UsageError(f"--tracing: {exc}") from exc
    registry = target.registry if isinstance(target, App) else target
    app = App(settings, registry=registry, tracer=tracer)
    if once:
        try:
            outcome = checked(app.run_once, worker_id=worker_id)
        finally:
            app.close()
        _print_outcome(outcome, as_json)
        sys.exit(0 if once_succeeded(outcome) else 1)
    if worker_id is not None:  # the pool's workers are <worker id>-<slot>: checked as the option given
        try:
            check_base_id(worker_id, settings.pool.concurrency, field="--worker-id")
        except InvalidArgument as exc:
            raise click.UsageError(str(exc)) from exc
    try:
        with ExitStack() as beside:
            observer = None
            if metrics_port is not None:
                endpoint = MetricsEndpoint(metrics_host, metrics_port)
                observer = beside.enter_context(
                    serving_metrics(
                        endpoint, settings.database_url, log_level=log_level, log_format=log_format
                    )
                )
            tend = None
            if retention is not None:
                policy = RetentionPolicy(retention)
                pruner = beside.enter_context(
                    pruning_beside(settings.database_url, policy, log_level=log_level, log_format=log_format)
                )
                tend = pruner.tend  # restarts it when it dies
            report = app.run_pool(worker_id=worker_id, observer=observer, tend=tend)
    except RunifoldError as exc:
        raise cli_error(exc) from exc
    if as_json:
        click.echo(
            json.dumps(
                {
                    "outcomes": report.outcomes,
                    "per_worker": report.per_worker,
                    "restarts": report.restarts,
                    "recycled": report.recycled,
                    "stopped_by": report.stopped_by,
                    "timed_out": report.timed_out,
                }
            )
        )
    else:
        click.echo(report.summary())
    if report.stopped_by is not None:
        no_json_error(click.get_current_context())  # the report above says stopped_by
        raise click.ClickException(f"the pool stopped: {report.stopped_by}")


def _print_outcome(outcome: RunOutcome, as_json: bool) -> None:
    if as_json:
        from ..model.codec import unstructure

        click.echo(json.dumps({"outcome": outcome.kind, **unstructure(outcome)}, default=str))
    else:
        click.echo(repr(outcome))


@click.command()
@click.option(
    "--database",
    metavar="URL",
    default=DEMO_URL,
    show_default=True,
    help="Store URL the demo runs on. A SQLite file is replaced if it exists; on another "
    "store the demo's tasks get ids of their own for this run.",
)
@click.option("--orders", type=click.IntRange(1, 20), default=4, show_default=True, help="Tasks to enqueue.")
@click.option(
    "--concurrency", type=click.IntRange(1, 8), default=2, show_default=True, help="Worker processes."
)
@json_option
def demo(database: str, orders: int, concurrency: int, as_json: bool) -> None:
    """Run order-intake workflows on a pool of worker processes, SIGKILL one worker
    mid-step and watch the pool finish every task without repeating completed steps.
    Exits 1 unless every order completed."""
    from .demo import STEPS_PER_ORDER, run_demo

    last: list[Any] = []

    def report(phase: str, rows: list[DemoRow]) -> None:
        snapshot = [phase, [(r.state, r.steps_done) for r in rows]]
        if as_json or snapshot == last:
            return
        last[:] = snapshot
        progress = "  ".join(f"{r.task_id}:{r.state}[{r.steps_done}/{STEPS_PER_ORDER}]" for r in rows)
        click.echo(f"{phase:<48} {progress}")

    if not as_json:
        click.echo(f"demo store: {redacted(database)}")
    result = checked(run_demo, database, orders, concurrency, report)
    rows = result.rows
    completed = sum(r.state == "completed" for r in rows)
    repeated = sum(r.step_runs - r.steps_done for r in rows)
    if as_json:
        echo_json(
            {
                "database": redacted(database),
                "killed": result.killed,
                "orders": [attrs.asdict(r) for r in rows],
                "completed": completed,
                "step_bodies_repeated": repeated,
            }
        )
    else:
        _print_demo_table(rows)
        click.echo(
            f"\n{completed}/{len(rows)} completed. "
            f"Step bodies started again after the kill: {repeated} (only the step in flight "
            "may run again; completed steps are replayed from the checkpoint)."
        )
    if completed != len(rows):
        sys.exit(1)


def _print_demo_table(rows: list[DemoRow]) -> None:
    click.echo("")
    width = max(10, *(len(r.task_id) for r in rows))
    header = (
        f"{'task':<{width}} {'state':<10} {'steps done':>10} {'bodies started':>15} "
        f"{'fencing token':>14}  last worker"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for r in rows:
        click.echo(
            f"{r.task_id:<{width}} {r.state:<10} {r.steps_done:>10} {r.step_runs:>15} "
            f"{r.fencing_token:>14}  {r.last_worker}"
        )
