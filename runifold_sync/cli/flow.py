"""``flow``: set, remove and list the flow limits (concurrency and rate per key,
definition or queue) at run time, and see where each limited group stands."""

from __future__ import annotations

import click

from ..model import validate
from ..model.flow import SCOPES, FlowGroup, FlowLimit, Rate
from .common import checked, database_option, echo_json, json_option, opened_store


@click.group()
def flow() -> None:
    """Flow limits: at most N running, or N claims per period, per concurrency key (or
    key prefix ending in '*'), per definition or per queue. Enforced by every worker's
    next claim."""


def limit_json(limit: FlowLimit) -> dict[str, object]:
    rate = limit.rate
    return {
        "scope": limit.scope,
        "target": limit.target,
        "max_running": limit.max_running,
        "rate_count": None if rate is None else rate.count,
        "rate_period_s": None if rate is None else rate.period.total_seconds(),
    }


def group_json(group: FlowGroup) -> dict[str, object]:
    next_at = group.next_claim_at
    return {
        "limit": limit_json(group.limit),
        "group": group.name,
        "running": group.running,
        "claimed_in_window": group.claimed_in_window,
        "waiting": group.waiting,
        "next_claim_at": None if next_at is None else next_at.isoformat(),
        "hold_reason": group.hold_reason(),
    }


def group_line(group: FlowGroup) -> str:
    limit = group.limit
    parts = [f"running {group.running}" + ("" if limit.max_running is None else f"/{limit.max_running}")]
    if limit.rate is not None:
        parts.append(f"claims {group.claimed_in_window}/{limit.rate}")
    parts.append(f"waiting {group.waiting}")
    held = group.hold_reason()
    return f"{limit.scope} {group.name}: " + ", ".join(parts) + ("" if held is None else f"  HELD: {held}")


@flow.command("set")
@click.argument("scope", type=click.Choice(SCOPES))
@click.argument("target")
@click.option("--max-running", type=int, default=None, help="At most this many leased at once (0 holds).")
@click.option("--rate", "rate_count", type=int, default=None, help="At most this many claims per --per.")
@click.option(
    "--per", "per_s", type=float, default=1.0, show_default=True, help="The rate's period in seconds."
)
@database_option
@json_option
def flow_set(
    scope: str,
    target: str,
    max_running: int | None,
    rate_count: int | None,
    per_s: float,
    database: str | None,
    as_json: bool,
) -> None:
    """Set the limit on SCOPE (key, definition or queue) TARGET, replacing any earlier
    one. A key TARGET ending in '*' applies to every key with that prefix, each key
    counted on its own."""
    source = click.get_current_context().get_parameter_source("per_s")
    if rate_count is None and source is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--per needs --rate: the period is the rate's")
    rate = None
    if rate_count is not None:
        rate = checked(Rate, rate_count, checked(validate.seconds, "--per", per_s, minimum_s=0.001))
    limit = checked(FlowLimit, scope, target, max_running, rate)
    with opened_store(database) as store:
        store.set_flow_limit(limit)
    if as_json:
        echo_json(limit_json(limit))
    else:
        click.echo(f"set {limit.describe()}")


@flow.command("remove")
@click.argument("scope", type=click.Choice(SCOPES))
@click.argument("target")
@database_option
@json_option
def flow_remove(scope: str, target: str, database: str | None, as_json: bool) -> None:
    """Remove the limit on SCOPE TARGET; its tasks are claimed without it from the next claim."""
    with opened_store(database) as store:
        removed = checked(store.remove_flow_limit, scope, target)
    if as_json:
        echo_json({"scope": scope, "target": target, "removed": removed})
    else:
        click.echo(f"removed the limit on {scope} {target}" if removed else f"no limit on {scope} {target}")


@flow.command("list")
@database_option
@json_option
def flow_list(database: str | None, as_json: bool) -> None:
    """List the limits, then each limited group with tasks running, waiting or claimed
    within its rate's window: running against max_running, claims against the rate,
    ready tasks waiting, and which limit holds them."""
    with opened_store(database, reads_only=True) as store:
        limits = store.flow_limits()
        groups = store.flow_groups()
    if as_json:
        echo_json({"limits": [limit_json(x) for x in limits], "groups": [group_json(g) for g in groups]})
        return
    if not limits:
        click.echo("no flow limits")
    for limit in limits:
        click.echo(f"limit {limit.describe()}")
    for group in groups:
        click.echo(group_line(group))


@flow.command("age")
@click.option(
    "--waited", "waited_s", type=float, required=True, help="Seconds ready per priority level gained."
)
@click.option("--up-to", type=int, required=True, help="The highest priority aging gives.")
@database_option
@json_option
def flow_age(waited_s: float, up_to: int, database: str | None, as_json: bool) -> None:
    """Priority aging: raise every ready task one priority level for each --waited
    seconds it has been ready, up to --up-to. Run it periodically (cron, a schedule) so
    lower priority work is not starved by a steady stream of higher priority work."""
    waited = checked(validate.seconds, "--waited", waited_s, minimum_s=0.001)
    with opened_store(database) as store:
        raised = checked(store.age_priorities, waited, up_to=up_to)
    if as_json:
        echo_json({"raised": raised})
    else:
        click.echo(f"raised the priority of {raised} tasks")
