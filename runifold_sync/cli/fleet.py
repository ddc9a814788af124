"""The store-wide commands: schema migration, referenced definition versions, the
worker registry, queue statistics and tenant admission policies."""

from __future__ import annotations

import json
import sys

import attrs
import click

from ..model import validate
from ..model.admission import TenantAdmission, TenantBudget, TenantPolicy
from ..ops.in_flight import ReplayFinding, VersionPatches, patches_in_flight, replay_check
from ..store.records import VersionReference
from ..store.serving import served_versions, unserved_work
from ..workflow.registry import WorkflowRegistry
from .common import app_option, checked, database_option, echo_json, json_option, opened_store
from .flow import group_json, group_line


@click.command()
@database_option
@json_option
def migrate(database: str | None, as_json: bool) -> None:
    """Create or upgrade the store's schema (safe while workers run)."""
    with opened_store(database) as store:
        version = store.migrate()
    if as_json:
        echo_json({"schema_version": version})
    else:
        click.echo(f"schema version {version}")


def _version_json(r: VersionReference) -> dict[str, object]:
    return {"name": r.name, "version": r.version, "tasks": r.total}


live_option = click.option(
    "--live-within",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="A worker seen within this many seconds (store time) counts as live.",
)


@click.command()
@app_option("Check these versions are registered.")
@live_option
@click.option(
    "--replay",
    is_flag=True,
    help="With --app: replay every run in flight against the app's code, running no step "
    "body or effect, and exit 1 naming each run that would diverge.",
)
@database_option
@json_option
def versions(
    app_ref: str | None, live_within: float, replay: bool, database: str | None, as_json: bool
) -> None:
    """List definition versions still referenced by queued, leased, waiting or
    recoverable tasks, how many live workers serve each, and the patches (ctx.patched)
    each run in flight has and has not recorded. With --app, exit 1 when the app lacks
    one of them or has changed its steps under the same version (another step
    fingerprint than its tasks were checkpointed with): the deploy preflight. With
    --replay too, exit 1 when the app's code would not continue a run as recorded."""
    from ..app import load_registry

    if replay and app_ref is None:
        raise click.UsageError("--replay needs --app: the new code to replay the runs in flight against")
    registry = None if app_ref is None else checked(load_registry, app_ref)
    window = checked(validate.seconds, "--live-within", live_within, minimum_s=0)
    with opened_store(database, reads_only=True) as store:
        served = served_versions(store, window)
        references = [s.reference for s in served]
        patches = patches_in_flight(store, references, registry)
        replayed = None if not replay or registry is None else replay_check(store, references, registry)
    diverged = () if replayed is None else replayed.diverged
    missing = [r for r in references if registry is not None and registry.get(r.name, r.version) is None]
    changed = [] if registry is None else _changed_steps(registry, references)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "referenced": [
                        attrs.asdict(s.reference) | {"live_workers": s.live_workers} for s in served
                    ],
                    "missing": [{"name": r.name, "version": r.version} for r in missing],
                    "changed": [
                        {
                            "name": r.name,
                            "version": r.version,
                            "checkpointed": list(r.fingerprints),
                            "app": app,
                        }
                        for r, app in changed
                    ],
                    "unserved": [_version_json(s.reference) for s in served if not s.live_workers],
                    "patches": [_patches_json(p) for p in patches],
                }
                | (
                    {}
                    if replayed is None
                    else {
                        "replay": {
                            "checked": replayed.checked,
                            "diverged": [_finding_json(f) for f in diverged],
                        }
                    }
                ),
                indent=2,
            )
        )
    else:
        for s in served:
            r = s.reference
            flag = "  MISSING from app" if r in missing else ""
            flag += "".join(
                f"  CHANGED in app: tasks checkpointed with steps {', '.join(r.fingerprints)}, "
                f"the app's are {app}"
                for c, app in changed
                if c == r
            )
            click.echo(
                f"{r.name} v{r.version}: {r.queued} queued, {r.leased} leased, {r.waiting} waiting, "
                f"{r.recoverable} recoverable; served by {s.live_workers} live worker(s){flag}"
            )
        if not references:
            click.echo("no task references any definition version")
        for p in patches:
            click.echo(f"{p.name} v{p.version} patches: {', '.join(p.known)}")
            for t in p.tasks:
                click.echo(
                    f"  {t.task_id} ({t.state}): recorded {', '.join(t.recorded) or '-'}; "
                    f"not recorded {', '.join(t.missing) or '-'}"
                )
        if replayed is not None:
            click.echo(
                f"replayed {replayed.checked} run(s) in flight against the app: {len(diverged)} diverge"
            )
            for f in diverged:
                d = f.divergence
                click.echo(
                    f"  DIVERGES {f.task_id} ({f.name} v{f.version}) at call {d.position}: "
                    f"recorded {d.recorded}, new code {d.new}"
                )
    if missing or changed or diverged:
        sys.exit(1)


def _patches_json(p: VersionPatches) -> dict[str, object]:
    return {
        "name": p.name,
        "version": p.version,
        "patches": list(p.known),
        "tasks": [
            {"task_id": t.task_id, "state": t.state, "recorded": list(t.recorded), "missing": list(t.missing)}
            for t in p.tasks
        ],
    }


def _finding_json(f: ReplayFinding) -> dict[str, object]:
    d = f.divergence
    return {
        "task_id": f.task_id,
        "name": f.name,
        "version": f.version,
        "position": d.position,
        "recorded": d.recorded,
        "new": d.new,
        "reason": d.reason,
    }


def _changed_steps(
    registry: WorkflowRegistry, references: list[VersionReference]
) -> list[tuple[VersionReference, str]]:
    """The referenced versions the app registers with other steps than some of their
    tasks were checkpointed with, and the app's fingerprint for each."""
    changed = []
    for reference in references:
        definition = registry.get(reference.name, reference.version)
        if definition is None:
            continue
        fingerprint = definition.identity.fingerprint
        if any(recorded != fingerprint for recorded in reference.fingerprints):
            changed.append((reference, fingerprint))
    return changed


@click.command()
@live_option
@database_option
@json_option
def workers(live_within: float, database: str | None, as_json: bool) -> None:
    """List registered workers: host, pid, start, last seen, the queues they claim from
    and the versions they serve."""
    window = checked(validate.seconds, "--live-within", live_within, minimum_s=0)
    with opened_store(database, reads_only=True) as store:
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
                        "queues": list(w.queues),
                        "definitions": [
                            {"name": n, "version": v, "fingerprint": w.fingerprints.get((n, v))}
                            for n, v in w.definitions
                        ],
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
        queues = ",".join(w.queues)
        click.echo(f"{w.worker_id:<24} {w.host:<16} pid {w.pid:<8} {status:<14} queues {queues}: {serves}")


@click.command()
@live_option
@database_option
@json_option
def stats(live_within: float, database: str | None, as_json: bool) -> None:
    """Show queue depth and the oldest ready task's age per tenant and state, tenants
    held back by admission, each flow-limited group (running, limit, waiting),
    referenced definition versions no live worker serves, and queued work no live
    worker can claim (its queue, version or steps)."""
    with opened_store(database, reads_only=True) as store:
        queues = store.queue_stats()
        tenants = store.tenant_admission()
        groups = store.flow_groups()
        unserved = [
            s.reference
            for s in served_versions(
                store, checked(validate.seconds, "--live-within", live_within, minimum_s=0)
            )
            if not s.live_workers
        ]
        blocked = unserved_work(store, checked(validate.seconds, "--live-within", live_within, minimum_s=0))
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
            "flow": [group_json(g) for g in groups],
            "unserved": [_version_json(v) for v in unserved],
            "unserved_routes": [
                {
                    "queue": u.backlog.queue,
                    "definition": u.backlog.name,
                    "version": u.backlog.version,
                    "fingerprint": u.backlog.fingerprint,
                    "tasks": u.backlog.tasks,
                    "reason": u.reason,
                }
                for u in blocked
            ],
        }
        click.echo(json.dumps(report, indent=2))
        return
    if not queues:  # said, so an empty store is not mistaken for a command that printed nothing
        click.echo("no tasks")
    for r in queues:
        state = r.state.value if r.outcome is None else f"{r.state.value}/{r.outcome.value}"
        age = "" if r.oldest_ready_age_s is None else f"  oldest ready for {r.oldest_ready_age_s:.1f}s"
        click.echo(f"{r.tenant:<16} {state:<20} {r.count:>8}{age}")
    for a in tenants:
        click.echo(_admission_line(a))
    for g in groups:
        click.echo(group_line(g))
    for v in unserved:
        click.echo(f"UNSERVED: {v.name} v{v.version} ({v.total} tasks): no live worker registers it")
    for u in blocked:
        b = u.backlog
        click.echo(f"UNSERVED: queue {b.queue}, {b.name} v{b.version} ({b.tasks} tasks): {u.reason}")


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


def _unlimited_json(tenant: str) -> dict[str, object]:
    """``tenant set``'s answer for a tenant left with no limit: the keys of
    :func:`_admission_json`, so a script reads both answers alike. The store counts
    leases, charges and ready tasks only for tenants with a policy (``tenant_admission``),
    so those are null rather than a guessed 0; nothing is held without limits."""
    return {
        "tenant": tenant,
        "max_leased": None,
        "leased": None,
        "budget_cost": None,
        "budget_window_s": None,
        "spent": None,
        "ready": None,
        "held": 0,
        "hold_reason": None,
    }


def _admission_line(a: TenantAdmission) -> str:
    limit = "unlimited" if a.policy.max_leased is None else str(a.policy.max_leased)
    budget = a.policy.budget
    spend = "no budget" if budget is None else f"charged {a.spent:g} of {budget.cost:g} per {budget.window}"
    held = f"; {a.held} ready task(s) held: {a.hold_reason()}" if a.held else ""
    return f"tenant {a.policy.tenant}: {a.leased} leased of {limit}; {spend}{held}"


@click.group()
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
@json_option
def tenant_set(
    name: str,
    max_leased: int | None,
    budget: float | None,
    budget_window: float,
    database: str | None,
    as_json: bool,
) -> None:
    """Replace tenant NAME's admission policy; a limit left out is unlimited. Workers
    everywhere apply it from their next claim; held tasks stay queued, never fail. Prints
    the tenant's admission with the fields of 'tenant list'; with no limit left the
    tenant has no policy, so its limits are null, held is 0, and leased, spent and ready
    (counted only for a tenant with a policy) are null."""
    source = click.get_current_context().get_parameter_source("budget_window")
    if budget is None and source is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--budget-window needs --budget: the window is the budget's")
    window = checked(validate.seconds, "--budget-window", budget_window, minimum_s=0.001)
    policy = checked(
        TenantPolicy, name, max_leased, None if budget is None else checked(TenantBudget, budget, window)
    )
    with opened_store(database) as store:
        store.set_tenant_policy(policy)
        current = {a.policy.tenant: a for a in store.tenant_admission()}
    if as_json:
        echo_json(_admission_json(current[name]) if name in current else _unlimited_json(name))
    else:
        click.echo(_admission_line(current[name]) if name in current else f"tenant {name}: no limits")


@tenant.command("list")
@database_option
@json_option
def tenant_list(database: str | None, as_json: bool) -> None:
    """List tenants with a policy: leases and limit, charges and budget, held tasks."""
    with opened_store(database, reads_only=True) as store:
        tenants = store.tenant_admission()
    if as_json:
        click.echo(json.dumps([_admission_json(a) for a in tenants], indent=2))
        return
    for a in tenants:
        click.echo(_admission_line(a))
    if not tenants:
        click.echo("no tenant has a policy: every tenant is unlimited")
