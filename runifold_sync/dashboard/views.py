"""The dashboard's pages, each a read of the store rendered by its template: the
overview, the task list (filters, search by id, keyset pages), a task, the workers, the
referenced versions, the tenants and the schedules."""

from __future__ import annotations

import re
import secrets
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import flask
from werkzeug.routing import BaseConverter

from ..errors import InvalidArgument, TaskNotFound
from ..model import validate
from ..model.attributes import AttributeValue, parse_where
from ..model.values import TaskOutcome, TaskState
from ..ops.task_report import failure_line, journal_lines, refused_signals_line, task_report
from ..store.checks import MAX_LIST_LIMIT
from ..store.records import TaskRecord
from ..store.serving import DEFAULT_LIVE_WITHIN, served_versions, unserved_work
from ..store.sql_reads import MAX_PAGE_SCAN
from . import charts
from .board import dashboard

pages = flask.Blueprint("pages", __name__)


class TaskIdConverter(BaseConverter):
    """A task id in a URL (``<task_id:...>``), as one path segment: ``/`` in it is sent as
    ``%2F``, so a browser never reads an id such as ``../../workers`` as a way to another
    page. The server decodes ``%2F`` before routing, so the segment matches whatever the
    id holds, slashes included. An id of ``.`` or ``..`` alone would still be a dot
    segment, which a browser resolves away however it is spelt (``%2e`` too): it is sent
    with a ``~`` appended, and an id of one or two dots and then tildes with one more, so
    each id has one URL and each URL one id."""

    regex = ".+?"
    part_isolating = False
    weight = 200

    def to_python(self, value: str) -> str:
        return value[:-1] if _DOTS_TILDES.fullmatch(value) and value.endswith("~") else value

    def to_url(self, value: str) -> str:
        segment = quote(value, safe="!$&'()*+,:;=@")  # werkzeug's path segment, less "/"
        return segment + "~" if _DOTS_TILDES.fullmatch(value) else segment


_DOTS_TILDES = re.compile(r"\.\.?~*")

PAGE_SIZE = 50
JOURNAL_LIMIT = 200  # the newest entries a task page shows
THROUGHPUT_SPAN = timedelta(hours=1)
THROUGHPUT_INTERVALS = 12
# The columns of the overview's counts: unfinished states, then how finished ones ended.
COLUMNS = ("queued", "leased", "waiting", "completed", "failed", "cancelled")
FILTERS = ("state", "tenant", "definition", "queue", "parent")
# The state filter each column's counts link to (completed and failed are both terminal).
COLUMN_STATES = {c: "terminal" if c in ("completed", "failed") else c for c in COLUMNS}


def column(state: TaskState, outcome: TaskOutcome | None) -> str:
    if state is TaskState.TERMINAL:
        return outcome.value if outcome is not None else "completed"
    return state.value


@pages.get("/")
def overview() -> str:
    store = dashboard().store
    counts: dict[str, dict[str, int]] = {}
    oldest: float | None = None
    for row in store.queue_stats():
        counts.setdefault(row.tenant, dict.fromkeys(COLUMNS, 0))[column(row.state, row.outcome)] += row.count
        if row.oldest_ready_age_s is not None:
            oldest = max(oldest or 0.0, row.oldest_ready_age_s)
    totals = {c: sum(tenant[c] for tenant in counts.values()) for c in COLUMNS}
    live = [w for w in store.workers() if w.live(DEFAULT_LIVE_WITHIN)]
    return flask.render_template(
        "overview.html",
        counts=sorted(counts.items()),
        totals=totals,
        columns=COLUMNS,
        column_states=COLUMN_STATES,
        oldest_ready_s=oldest,
        chart=charts.throughput(store.finished_per_interval(THROUGHPUT_SPAN, THROUGHPUT_INTERVALS)),
        holds=[a for a in store.tenant_admission() if a.hold_reason() is not None],
        unserved=unserved_work(store),
        unserved_versions=[s for s in served_versions(store) if not s.live_workers],
        workers=live,
        schedules=store.schedules(),
        now=store.now(),
    )


def _filters() -> dict[str, Any]:
    """The task list's filters from the query string (empty ones left out)."""
    args = flask.request.args
    found: dict[str, Any] = {name: args[name].strip() for name in FILTERS if args.get(name, "").strip()}
    if "state" in found:
        try:
            found["state"] = TaskState(found["state"])
        except ValueError:
            states = ", ".join(s.value for s in TaskState)
            validate.refuse("state", f"one of {states}", found["state"])
    attributes: dict[str, AttributeValue] = {}
    for condition in _where():
        key, value = parse_where(condition)  # refused (400) naming the condition
        if key in attributes:
            raise InvalidArgument(f"where: attribute {key!r} is given twice")
        attributes[key] = value
    if attributes:
        found["attributes"] = attributes
    return found


def _where() -> list[str]:
    """The task list's attribute conditions (``where=key=value``, repeatable)."""
    return [c.strip() for c in flask.request.args.getlist("where") if c.strip()]


@pages.get("/tasks")
def tasks() -> flask.typing.ResponseReturnValue:
    store = dashboard().store
    args = flask.request.args
    searched = args.get("id", "").strip()
    missing = None
    if searched:
        try:
            store.get_task(searched)
        except TaskNotFound:
            missing = searched
        else:
            return flask.redirect(flask.url_for("pages.task", task_id=searched), 303)
    filters = _filters()
    limit = _limit(args.get("limit", ""))
    order = args.get("order") or "oldest"
    if order not in ("oldest", "newest"):
        validate.refuse("order", "oldest or newest", order)
    page = store.list_tasks_page(
        after=args.get("after") or None, limit=limit, newest_first=order == "newest", **filters
    )
    query = {k: (v.value if isinstance(v, TaskState) else v) for k, v in filters.items() if k != "attributes"}
    if "attributes" in filters:
        query["where"] = _where()
    if limit != PAGE_SIZE:
        query["limit"] = limit
    if order != "oldest":
        query["order"] = order
    return flask.render_template(
        "tasks.html",
        page=page,
        filters=query,
        states=[s.value for s in TaskState],
        missing=missing,
        first_page=bool(args.get("after")),
        next_query=None if page.next_after is None else query | {"after": page.next_after},
        first_query=query,
        state_text=state_text,
        limit=limit,
        scan=MAX_PAGE_SCAN,
        order=order,
    )


def _limit(text: str) -> int:
    if not text:
        return PAGE_SIZE
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIST_LIMIT:
        validate.refuse("limit", f"an integer in 1..{MAX_LIST_LIMIT}", text)
    return limit


def state_text(record: TaskRecord) -> str:
    if record.outcome is not None:
        return f"{record.state.value}/{record.outcome.value}"
    return record.state.value + (" (paused)" if record.paused else "")


@pages.get("/tasks/<task_id:task_id>")
def task(task_id: str) -> str:
    board = dashboard()
    store = board.store
    report = task_report(store, task_id, JOURNAL_LIMIT)
    record = report.record
    definition = (
        None
        if board.registry is None
        else board.registry.get(record.definition_name, record.definition_version)
    )
    finished = record.state in (TaskState.TERMINAL, TaskState.CANCELLED)
    signals = [e for e in report.history if e.kind.startswith("signal_")]
    return flask.render_template(
        "task.html",
        report=report,
        record=record,
        state_text=state_text,
        journal=list(zip(report.journal, journal_lines(report), strict=True)),
        failure=None if report.failure is None else failure_line(report.failure),
        timeline=charts.timeline(report.history, store.now(), finished),
        pending_signals=store.pending_signals(task_id),
        signal_events=signals,
        refused_signals=refused_signals_line(record),
        actions=available_actions(record),
        new_signal_id=f"dashboard-{secrets.token_hex(8)}",
        budget=None if definition is None else definition.budget,
        registry_given=board.registry is not None,
    )


def available_actions(record: TaskRecord) -> list[str]:
    """The actions that apply to ``record`` as it stands."""
    found = []
    if record.state in (TaskState.QUEUED, TaskState.LEASED, TaskState.WAITING):
        found += ["cancel", "resume" if record.paused else "pause", "signal", "approval"]
    if record.outcome is TaskOutcome.FAILED:
        found.append("resolve" if record.ambiguous_effect else "retry")
    if record.state is TaskState.CANCELLED:
        found.append("resume")
    if record.checkpoint_json is not None:
        found.append("fork")
    return found


@pages.get("/workers")
def workers() -> str:
    return flask.render_template(
        "workers.html", workers=dashboard().store.workers(), within=DEFAULT_LIVE_WITHIN
    )


@pages.get("/versions")
def versions() -> str:
    return flask.render_template("versions.html", versions=served_versions(dashboard().store))


@pages.get("/tenants")
def tenants() -> str:
    store = dashboard().store
    return flask.render_template(
        "tenants.html",
        tenants=store.tenant_admission(),
        flow_limits=store.flow_limits(),
        flow_groups=store.flow_groups(),
    )


@pages.get("/schedules")
def schedules() -> str:
    store = dashboard().store
    return flask.render_template("schedules.html", schedules=store.schedules(), now=store.now())
