"""``python -m runifold_sync``: a thin click layer over the library.

Each command parses its options, calls the library and prints. Library errors become
``ClickException`` here and nowhere else.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import attrs
import click

from .admission import TenantAdmission, TenantBudget, TenantPolicy
from .checkpoint import Checkpoint
from .codec import NotJsonable, to_json
from .errors import RunifoldError
from .logs import LogFormat, configure_logging
from .metrics_endpoint import MetricsEndpoint, serving_metrics
from .models import TaskState, WorkflowTask
from .operations import served_versions
from .outcomes import RunOutcome
from .runner import (
    RunifoldSettings,
    default_worker_id,
    describe_report,
    once_succeeded,
    run_one_cycle,
    run_pool,
)
from .store.base import TaskRecord, VersionReference, WorkflowStore
from .stores import ENV_VAR, default_url, open_store

database_option = click.option(
    "--database",
    metavar="URL",
    default=None,
    help=f"Store URL (sqlite:///path.db or postgresql://...); default ${ENV_VAR}, else a local SQLite file.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


@contextmanager
def _store(url: str | None) -> Iterator[WorkflowStore]:
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


def _canonical_json(text: str, option: str) -> str:
    """Strict JSON (no NaN or Infinity) in the canonical form the store compares."""
    try:
        return to_json(json.loads(text))
    except (json.JSONDecodeError, NotJsonable) as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=option) from exc


def _checked(call: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except RunifoldError as exc:
        raise click.ClickException(str(exc)) from exc


@click.group()
def main() -> None:
    """Durable workflows for synchronous Python."""


@main.command()
@click.option(
    "--app", "app_ref", required=True, metavar="MODULE:ATTR", help="The application's WorkflowRegistry."
)
@database_option
@click.option(
    "--concurrency", type=click.IntRange(min=1), default=1, show_default=True, help="Worker processes."
)
@click.option(
    "--worker-id",
    default=default_worker_id,
    help="Stable base id; pool workers are <base>-<slot>.  [default: host name]",
)
@click.option(
    "--lease",
    "lease_s",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Lease seconds.",
)
@click.option(
    "--heartbeat",
    "heartbeat_s",
    type=click.FloatRange(min=0.05),
    default=10.0,
    show_default=True,
    help="Heartbeat interval seconds (at most half the lease).",
)
@click.option(
    "--claim-batch",
    type=click.IntRange(1, 100),
    default=1,
    show_default=True,
    help="Tasks each worker claims at once and runs in turn (their leases kept alive; "
    "handed back if the task before them runs over half a lease). More saves claims on "
    "short tasks; 1 keeps claims fairest across tenants.",
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
@json_option
def run(
    app_ref: str,
    database: str | None,
    concurrency: int,
    worker_id: str,
    lease_s: float,
    heartbeat_s: float,
    claim_batch: int,
    once: bool,
    metrics_port: int | None,
    metrics_host: str,
    log_level: str,
    log_format: LogFormat,
    as_json: bool,
) -> None:
    """Run workers: a supervised pool of processes, or with --once a single cycle whose
    exit status is 0 for idle, completed, suspended, retried or yielded and 1 otherwise."""
    if once and metrics_port is not None:
        raise click.UsageError(
            "--metrics-port serves a running pool's metrics and cannot be used with --once"
        )
    configure_logging(log_level, log_format)
    settings = _checked(
        RunifoldSettings.from_mapping,
        {
            "RUNIFOLD_DATABASE_URL": database,
            "RUNIFOLD_APP": app_ref,
            "RUNIFOLD_CONCURRENCY": concurrency,
            "RUNIFOLD_LEASE_SECONDS": lease_s,
            "RUNIFOLD_HEARTBEAT_SECONDS": heartbeat_s,
            "RUNIFOLD_CLAIM_BATCH": claim_batch,
        },
    )
    if once:
        outcome = _checked(run_one_cycle, settings, worker_id)
        _print_outcome(outcome, as_json)
        sys.exit(0 if once_succeeded(outcome) else 1)
    if metrics_port is None:
        report = _checked(run_pool, settings, concurrency, worker_id)
    else:
        endpoint = MetricsEndpoint(metrics_host, metrics_port)
        metrics = serving_metrics(endpoint, settings.database_url, log_level=log_level, log_format=log_format)
        try:
            with metrics as observer:
                report = run_pool(settings, concurrency, worker_id, observer=observer)
        except RunifoldError as exc:
            raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(
            json.dumps(
                {
                    "outcomes": report.outcomes,
                    "per_worker": report.per_worker,
                    "restarts": report.restarts,
                    "recycled": report.recycled,
                }
            )
        )
    else:
        click.echo(describe_report(report))


def _print_outcome(outcome: RunOutcome, as_json: bool) -> None:
    if as_json:
        from .codec import unstructure

        click.echo(json.dumps({"outcome": outcome.kind, **unstructure(outcome)}, default=str))
    else:
        click.echo(repr(outcome))


@main.command()
@click.argument("name")
@click.argument("version", type=int)
@click.option("--input", "input_json", default="null", show_default=True, help="Workflow input as JSON.")
@click.option("--tenant", default="default", show_default=True, help="Tenant the task belongs to.")
@click.option("--checkpoint-id", default=None, help="Task identity; enqueue is idempotent on it.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher is claimed first.")
@database_option
@json_option
def enqueue(
    name: str,
    version: int,
    input_json: str,
    tenant: str,
    checkpoint_id: str | None,
    priority: int,
    database: str | None,
    as_json: bool,
) -> None:
    """Enqueue a task for definition NAME at VERSION."""
    try:
        value = json.loads(input_json)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from exc
    task = _checked(
        WorkflowTask.new, name, version, value, tenant=tenant, checkpoint_id=checkpoint_id, priority=priority
    )
    with _store(database) as store:
        result = store.enqueue(task)
    if as_json:
        click.echo(json.dumps({"task_id": result.task_id, "created": result.created}))
    else:
        click.echo(f"{result.task_id} ({'enqueued' if result.created else 'already enqueued'})")


@main.command()
@database_option
def migrate(database: str | None) -> None:
    """Create or upgrade the store's schema (safe while workers run)."""
    with _store(database) as store:
        version = store.migrate()
    click.echo(f"schema version {version}")


@main.command()
@click.argument("task_id")
@database_option
@json_option
def show(task_id: str, database: str | None, as_json: bool) -> None:
    """Show a task's state, why it is not running, its checkpoint and its history."""
    with _store(database) as store:
        record = store.get_task(task_id)
        events = store.history(task_id)
    journal: list[str] = []
    usage: dict[str, Any] = {}
    if record.checkpoint_json:
        checkpoint = _checked(Checkpoint.decode, task_id, record.checkpoint_json)
        journal = [f"{e.call_id} ({e.kind}, {e.status})" for e in checkpoint.journal]
        usage = {
            "steps": checkpoint.usage.steps,
            "cost": checkpoint.usage.cost,
            "elapsed_s": round(checkpoint.usage.elapsed_s, 3),
            "claims": checkpoint.usage.claims,
        }
    if as_json:
        click.echo(
            json.dumps(
                {
                    "task_id": record.task_id,
                    "definition": record.definition_name,
                    "version": record.definition_version,
                    "tenant": record.tenant,
                    "state": record.state.value,
                    "outcome": None if record.outcome is None else record.outcome.value,
                    "reason": record.reason,
                    "ambiguous_effect": record.ambiguous_effect,
                    "revision": record.revision,
                    "fencing_token": record.fencing_token,
                    "journal": journal,
                    "usage": usage,
                    "result": record.result,
                    "history": [
                        {
                            "at": e.at.isoformat(),
                            "kind": e.kind,
                            "worker": e.worker_id,
                            "token": e.fencing_token,
                            "detail": e.detail,
                        }
                        for e in events
                    ],
                },
                indent=2,
            )
        )
        return
    click.echo(
        f"task {record.task_id}: {record.definition_name} v{record.definition_version} ({record.tenant})"
    )
    click.echo(f"state: {record.state.value}" + (f" ({record.outcome.value})" if record.outcome else ""))
    if record.reason:
        click.echo(f"reason: {record.reason}")
    click.echo(f"revision {record.revision}, fencing token {record.fencing_token}, usage {usage}")
    for line in journal:
        click.echo(f"  {line}")
    click.echo("history:")
    for e in events:
        click.echo(f"  {e.at.isoformat()} {e.kind:<16} {e.worker_id or '-':<16} {e.detail}")


def _record_json(record: TaskRecord) -> dict[str, Any]:
    return {
        "task_id": record.task_id,
        "definition": record.definition_name,
        "version": record.definition_version,
        "tenant": record.tenant,
        "state": record.state.value,
        "outcome": None if record.outcome is None else record.outcome.value,
        "reason": record.reason,
        "ready_at": None if record.ready_at is None else record.ready_at.isoformat(),
        "worker": record.worker_id,
        "fencing_token": record.fencing_token,
    }


@main.command("list")
@click.option(
    "--state", type=click.Choice([s.value for s in TaskState]), default=None, help="Only this state."
)
@click.option("--tenant", default=None, help="Only this tenant.")
@click.option("--definition", default=None, help="Only this workflow name.")
@click.option(
    "--limit", type=click.IntRange(1, 10_000), default=100, show_default=True, help="At most this many."
)
@database_option
@json_option
def list_(
    state: str | None,
    tenant: str | None,
    definition: str | None,
    limit: int,
    database: str | None,
    as_json: bool,
) -> None:
    """List tasks, oldest first, with why each unfinished one is not running."""
    with _store(database) as store:
        records = store.list_tasks(
            state=None if state is None else TaskState(state),
            tenant=tenant,
            definition=definition,
            limit=limit,
        )
    if as_json:
        click.echo(json.dumps([_record_json(r) for r in records], indent=2))
        return
    for r in records:
        status = r.state.value if r.outcome is None else f"{r.state.value}/{r.outcome.value}"
        name = f"{r.definition_name} v{r.definition_version}"
        click.echo(f"{r.task_id:<34} {name:<24} {r.tenant:<12} {status:<18} {r.reason or ''}")


def _version_json(r: VersionReference) -> dict[str, object]:
    return {"name": r.name, "version": r.version, "tasks": r.total}


live_option = click.option(
    "--live-within",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="A worker seen within this many seconds (store time) counts as live.",
)


@main.command()
@click.option(
    "--app", "app_ref", default=None, metavar="MODULE:ATTR", help="Check these versions are registered."
)
@live_option
@database_option
@json_option
def versions(app_ref: str | None, live_within: float, database: str | None, as_json: bool) -> None:
    """List definition versions still referenced by queued, leased, waiting or
    recoverable tasks, and how many live workers serve each. With --app, exit 1 when the
    app lacks one of them (the deploy preflight)."""
    from .app import load_registry

    registry = None if app_ref is None else _checked(load_registry, app_ref)
    window = timedelta(seconds=live_within)
    with _store(database) as store:
        served = served_versions(store, window)
    references = [s.reference for s in served]
    missing = [r for r in references if registry is not None and registry.get(r.name, r.version) is None]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "referenced": [
                        attrs.asdict(s.reference) | {"live_workers": s.live_workers} for s in served
                    ],
                    "missing": [{"name": r.name, "version": r.version} for r in missing],
                    "unserved": [_version_json(s.reference) for s in served if not s.live_workers],
                },
                indent=2,
            )
        )
    else:
        for s in served:
            r = s.reference
            flag = "  MISSING from app" if r in missing else ""
            click.echo(
                f"{r.name} v{r.version}: {r.queued} queued, {r.leased} leased, {r.waiting} waiting, "
                f"{r.recoverable} recoverable; served by {s.live_workers} live worker(s){flag}"
            )
        if not references:
            click.echo("no task references any definition version")
    if missing:
        sys.exit(1)


@main.command()
@live_option
@database_option
@json_option
def workers(live_within: float, database: str | None, as_json: bool) -> None:
    """List registered workers: host, pid, start, last seen and the versions they serve."""
    window = timedelta(seconds=live_within)
    with _store(database) as store:
        records = store.workers()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "worker_id": w.worker_id,
                        "host": w.host,
                        "pid": w.pid,
                        "started_at": w.started_at.isoformat(),
                        "last_seen": w.last_seen.isoformat(),
                        "stopped_at": None if w.stopped_at is None else w.stopped_at.isoformat(),
                        "live": w.live(window),
                        "definitions": [{"name": n, "version": v} for n, v in w.definitions],
                    }
                    for w in records
                ],
                indent=2,
            )
        )
        return
    for w in records:
        status = "live" if w.live(window) else ("stopped" if w.stopped_at else f"silent {w.silent_s:.0f}s")
        serves = ", ".join(f"{n} v{v}" for n, v in w.definitions) or "-"
        click.echo(f"{w.worker_id:<24} {w.host:<16} pid {w.pid:<8} {status:<14} {serves}")


@main.command()
@live_option
@database_option
@json_option
def stats(live_within: float, database: str | None, as_json: bool) -> None:
    """Show queue depth and the oldest ready task's age per tenant and state, tenants
    held back by admission, and referenced definition versions no live worker serves."""
    with _store(database) as store:
        queues = store.queue_stats()
        tenants = store.tenant_admission()
        unserved = [
            s.reference for s in served_versions(store, timedelta(seconds=live_within)) if not s.live_workers
        ]
    if as_json:
        report = {
            "queues": [
                {
                    "tenant": r.tenant,
                    "state": r.state.value,
                    "outcome": None if r.outcome is None else r.outcome.value,
                    "count": r.count,
                    "oldest_ready_age_s": r.oldest_ready_age_s,
                }
                for r in queues
            ],
            "tenants": [_admission_json(a) for a in tenants],
            "unserved": [_version_json(v) for v in unserved],
        }
        click.echo(json.dumps(report, indent=2))
        return
    for r in queues:
        state = r.state.value if r.outcome is None else f"{r.state.value}/{r.outcome.value}"
        age = "" if r.oldest_ready_age_s is None else f"  oldest ready for {r.oldest_ready_age_s:.1f}s"
        click.echo(f"{r.tenant:<16} {state:<20} {r.count:>8}{age}")
    for a in tenants:
        click.echo(_admission_line(a))
    for v in unserved:
        click.echo(f"UNSERVED: {v.name} v{v.version} ({v.total} tasks): no live worker registers it")


def _admission_json(a: TenantAdmission) -> dict[str, object]:
    budget = a.policy.budget
    return {
        "tenant": a.policy.tenant,
        "max_leased": a.policy.max_leased,
        "leased": a.leased,
        "budget_cost": None if budget is None else budget.cost,
        "budget_window_s": None if budget is None else budget.window.total_seconds(),
        "spent": a.spent,
        "ready": a.ready,
        "held": a.held,
        "hold_reason": a.hold_reason(),
    }


def _admission_line(a: TenantAdmission) -> str:
    limit = "unlimited" if a.policy.max_leased is None else str(a.policy.max_leased)
    budget = a.policy.budget
    spend = "no budget" if budget is None else f"charged {a.spent:g} of {budget.cost:g} per {budget.window}"
    held = f"; {a.held} ready task(s) held: {a.hold_reason()}" if a.held else ""
    return f"tenant {a.policy.tenant}: {a.leased} leased of {limit}; {spend}{held}"


@main.group()
def tenant() -> None:
    """Tenant admission: limits on leased tasks and cost budgets, kept in the store."""


@tenant.command("set")
@click.argument("name")
@click.option(
    "--max-leased",
    type=click.IntRange(min=0),
    default=None,
    help="At most this many of its tasks leased at once (0 pauses the tenant). Default: unlimited.",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0),
    default=None,
    help="At most this many cost units (ctx.charge) per budget window. Default: no budget.",
)
@click.option(
    "--budget-window",
    type=click.FloatRange(min=0, min_open=True),
    default=3600.0,
    show_default=True,
    help="Length of the sliding budget window in seconds.",
)
@database_option
def tenant_set(
    name: str, max_leased: int | None, budget: float | None, budget_window: float, database: str | None
) -> None:
    """Replace tenant NAME's admission policy; a limit left out is unlimited. Workers
    everywhere apply it from their next claim; held tasks stay queued, never fail."""
    source = click.get_current_context().get_parameter_source("budget_window")
    if budget is None and source is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--budget-window needs --budget: the window is the budget's")
    window = timedelta(seconds=budget_window)
    policy = _checked(
        TenantPolicy, name, max_leased, None if budget is None else _checked(TenantBudget, budget, window)
    )
    with _store(database) as store:
        store.set_tenant_policy(policy)
        current = {a.policy.tenant: a for a in store.tenant_admission()}
    click.echo(_admission_line(current[name]) if name in current else f"tenant {name}: no limits")


@tenant.command("list")
@database_option
@json_option
def tenant_list(database: str | None, as_json: bool) -> None:
    """List tenants with a policy: leases and limit, charges and budget, held tasks."""
    with _store(database) as store:
        tenants = store.tenant_admission()
    if as_json:
        click.echo(json.dumps([_admission_json(a) for a in tenants], indent=2))
        return
    for a in tenants:
        click.echo(_admission_line(a))
    if not tenants:
        click.echo("no tenant has a policy: every tenant is unlimited")


@main.command()
@click.argument("task_id")
@click.argument("name")
@click.option("--payload", "payload_json", default="null", show_default=True, help="Signal payload as JSON.")
@click.option("--signal-id", required=True, help="Deduplication id: resending it delivers nothing new.")
@click.option("--sender", required=True, help="Who sends it (checked by the workflow, kept in the history).")
@click.option("--tenant", default="default", show_default=True, help="The sender's tenant.")
@click.option("--reason", default=None, help="Why (kept in the history).")
@database_option
def signal(
    task_id: str,
    name: str,
    payload_json: str,
    signal_id: str,
    sender: str,
    tenant: str,
    reason: str | None,
    database: str | None,
) -> None:
    """Send signal NAME to a task (an approval is {"approved": true, "reason": "..."})."""
    payload = json.loads(_canonical_json(payload_json, "--payload"))  # a value, checked strict
    with _store(database) as store:
        delivery = store.send_signal(
            task_id, name, payload, signal_id=signal_id, sender=sender, tenant=tenant, reason=reason
        )
    click.echo(f"{task_id}: signal {signal_id} {'delivered' if delivery.created else 'already delivered'}")


@main.command()
@click.argument("task_id")
@click.option("--actor", required=True, help="Who cancels it (kept in the history).")
@click.option("--reason", required=True, help="Why (kept in the history).")
@database_option
def cancel(task_id: str, actor: str, reason: str, database: str | None) -> None:
    """Cancel a task: at once if queued or waiting, at its next step boundary if running.
    Completed external writes are not undone."""
    with _store(database) as store:
        state = store.cancel(task_id, actor=actor, reason=reason)
    if state is TaskState.CANCELLED:
        click.echo(f"{task_id}: cancelled")
    else:
        click.echo(f"{task_id}: running; its worker stops at the next step boundary")


@main.command()
@click.argument("task_id")
@click.option("--actor", required=True, help="Who requeues it (kept in the history).")
@click.option("--reason", required=True, help="Why (kept in the history).")
@database_option
def retry(task_id: str, actor: str, reason: str, database: str | None) -> None:
    """Requeue a failed task; its completed steps are kept and not run again."""
    with _store(database) as store:
        store.requeue(task_id, actor=actor, reason=reason)
    click.echo(f"{task_id}: requeued")


@main.command()
@click.argument("task_id")
@click.argument("effect_key")
@click.option("--applied/--not-applied", required=True, help="Whether the effect happened.")
@click.option("--result", "result_json", default=None, help="The effect's result as JSON (with --applied).")
@click.option("--actor", required=True, help="Who decided (kept in the history).")
@click.option("--reason", required=True, help="Why (kept in the history).")
@database_option
def resolve(
    task_id: str,
    effect_key: str,
    applied: bool,
    result_json: str | None,
    actor: str,
    reason: str,
    database: str | None,
) -> None:
    """Resolve the ambiguous effect a task failed on, and requeue the task."""
    if result_json is not None:
        result_json = _canonical_json(result_json, "--result")
    with _store(database) as store:
        store.resolve_effect(
            task_id, effect_key, applied=applied, result_json=result_json, actor=actor, reason=reason
        )
    click.echo(
        f"{task_id}: effect {effect_key} resolved as {'applied' if applied else 'not applied'}; requeued"
    )


@main.command()
@click.option(
    "--database",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("runifold-demo.db"),
    show_default=True,
    help="SQLite file the demo creates (replaced if it exists).",
)
@click.option("--orders", type=click.IntRange(1, 20), default=4, show_default=True, help="Tasks to enqueue.")
@click.option(
    "--concurrency", type=click.IntRange(1, 8), default=2, show_default=True, help="Worker processes."
)
def demo(database: Path, orders: int, concurrency: int) -> None:
    """Run order-intake workflows on a pool of worker processes, SIGKILL one worker
    mid-step and watch the pool finish every task without repeating completed steps."""
    from .demo import STEPS_PER_ORDER, DemoRow, run_demo

    last: list[Any] = []

    def report(phase: str, rows: list[DemoRow]) -> None:
        snapshot = [phase, [(r.state, r.steps_done) for r in rows]]
        if snapshot == last:
            return
        last[:] = snapshot
        progress = "  ".join(f"{r.task_id}:{r.state}[{r.steps_done}/{STEPS_PER_ORDER}]" for r in rows)
        click.echo(f"{phase:<48} {progress}")

    click.echo(f"demo database: {database} (SQLite, synchronous=FULL)")
    rows = run_demo(database, orders, concurrency, report)
    click.echo("")
    header = (
        f"{'task':<10} {'state':<10} {'steps done':>10} {'bodies started':>15} "
        f"{'fencing token':>14}  last worker"
    )
    click.echo(header)
    click.echo("-" * len(header))
    for r in rows:
        click.echo(
            f"{r.task_id:<10} {r.state:<10} {r.steps_done:>10} {r.step_runs:>15} "
            f"{r.fencing_token:>14}  {r.last_worker}"
        )
    repeated = sum(r.step_runs - r.steps_done for r in rows)
    click.echo(
        f"\n{sum(r.state == 'completed' for r in rows)}/{len(rows)} completed. "
        f"Step bodies started again after the kill: {repeated} (only the step in flight "
        "may run again; completed steps are replayed from the checkpoint)."
    )
    if any(r.state != "completed" for r in rows):
        sys.exit(1)
