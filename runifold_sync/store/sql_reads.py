"""The store's reads (tasks, history, statistics, tenant admission),
the worker registry, store time and the lifecycle, written once over a
:class:`~runifold_sync.store.dialect.Dialect`. A task read says where an unfinished task
stands now (``TaskRecord.status_note``), derived here and never stored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TypedDict, Unpack

import attrs

from ..model import validate
from ..model.admission import TenantAdmission, TenantPolicy, explain
from ..model.attributes import AttributeValue
from ..model.checkpoint import JournalRow
from ..model.values import TaskState, WorkerId
from . import checks, row_records, sql_flow
from .dialect import Dialect
from .records import (
    ClockReading,
    FinishedInterval,
    QueueStats,
    RoutedBacklog,
    TaskEvent,
    TaskPage,
    TaskRecord,
    VersionReference,
    WorkerRecord,
    unserved_reason,
)
from .retries import retried
from .timing import PoolWaits, timed

# A worker last seen this long ago no longer counts as serving its queues (as the CLI's
# --live-within default).
LIVE_WITHIN = timedelta(seconds=60)


class TaskFilters(TypedDict, total=False):
    """The filters of :meth:`ReadOperations.list_tasks_page`, as :meth:`list_tasks` takes
    them: each given one must match."""

    state: TaskState | None
    tenant: str | None
    definition: str | None
    parent: str | None
    queue: str | None
    attributes: Mapping[str, AttributeValue] | None


# Where a walk of the tasks in creation order starts: before every task (after every
# task, walking newest first).
_FIRST = datetime(1, 1, 1, tzinfo=UTC)
_LAST = datetime(9999, 12, 31, tzinfo=UTC)
# The most intervals a throughput read splits its span into.
MAX_INTERVALS = 1000


# The most tasks (in creation order) one page of a filtered task list looks through: a
# filter that few tasks match gives short pages, each as cheap as a full one, instead of
# one page that reads the whole table to fill itself.
MAX_PAGE_SCAN = 10_000


def page_cursor(record: TaskRecord) -> str:
    """The cursor of the page after ``record``: its creation time and id."""
    return _cursor(record.created_at, record.task_id)


def _cursor(created_at: datetime, task_id: str) -> str:
    return f"{created_at.isoformat()}|{task_id}"


def _parse_cursor(after: object, newest_first: bool) -> tuple[datetime, str]:
    """``after`` (a cursor :func:`page_cursor` made, or None: the first page) as the
    (created_at, task_id) the page starts after (before, walking newest first)."""
    if after is None:
        return (_LAST, "") if newest_first else (_FIRST, "")
    if not isinstance(after, str) or "|" not in validate.text("task page cursor", after):
        validate.refuse("task page cursor", "a cursor a page returned", after)
    at, task_id = after.split("|", 1)
    try:
        created = datetime.fromisoformat(at)
    except ValueError:
        created = None
    if created is None or created.tzinfo is None:
        validate.refuse("task page cursor", "a cursor a page returned", after)
    return created, task_id


def _status(record: TaskRecord, now: datetime, *, anyone_live: bool) -> str | None:
    """Where a queued or leased task without a recorded reason stands at ``now``. A due
    task waits "for a free worker" only while some worker is live (``anyone_live``); with
    none live, saying so sent operators looking for a busy fleet that was down."""
    if record.state is TaskState.LEASED and record.lease_expires is not None:
        lease = f"{record.worker_id} (fencing token {record.fencing_token})"
        if record.lease_expires <= now:
            return (
                f"lease of {lease} expired at {record.lease_expires.isoformat()}: claimable by another worker"
            )
        return f"running on {lease}, lease until {record.lease_expires.isoformat()}"
    if record.state is TaskState.QUEUED and record.ready_at is not None:
        if record.ready_at <= now:
            waiting = "waiting for a free worker" if anyone_live else "no worker is live"
            return f"ready since {record.ready_at.isoformat()}: {waiting}"
        return f"scheduled: not claimable before {record.ready_at.isoformat()}"
    return None


def _running(record: TaskRecord, now: datetime) -> bool:
    return (
        record.state is TaskState.LEASED and record.lease_expires is not None and record.lease_expires > now
    )


class ReadOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect

    # --- reads -----------------------------------------------------------------------

    def get_task(self, task_id: str) -> TaskRecord:
        params = {"task_id": validate.text("task id", task_id)}
        row = retried(lambda: self.dialect.one("select_task", params))
        return self.explain_reasons([row_records.found_task(self.dialect, row, task_id)])[0]

    def task_records(self, task_ids: Sequence[str]) -> list[TaskRecord]:
        """The records of ``task_ids``, in their order, read in one statement and as stored:
        what a workflow waiting for its children reads of them, with none of the
        ``status_note`` that :meth:`get_task` works out for a person (four more reads a
        task). :class:`TaskNotFound` for an id with no task."""
        ids = [validate.text("task id", task_id) for task_id in task_ids]
        rows = retried(lambda: self.dialect.all("select_tasks", {"ids": self.dialect.db_ids(ids)}))
        found = {row["task_id"]: row for row in rows}
        return [row_records.found_task(self.dialect, found.get(task_id), task_id) for task_id in ids]

    def read_journal(self, task_id: str) -> list[JournalRow]:
        """Every stored journal entry of ``task_id``, by journal (the main function's,
        keyed ``""``, first) and position: what a claim loads to replay. Empty for an
        unknown task or one that has recorded nothing."""
        params = {"task_id": validate.text("task id", task_id)}
        found = retried(lambda: self.dialect.all("journal_rows", params))
        return [JournalRow(row["journal"], row["position"], row["entry"]) for row in found]

    def journal_tail(self, task_id: str, limit: int) -> tuple[int, list[JournalRow]]:
        """How many entries the main journal of ``task_id`` holds, and its newest
        ``limit`` in order: what ``show`` prints of a long journal."""
        validate.text("task id", task_id)
        limit = validate.integer("journal limit", limit, minimum=1, maximum=checks.MAX_LIST_LIMIT)
        length = self.dialect.one("journal_length", {"task_id": task_id})
        found = self.dialect.all("journal_tail", {"task_id": task_id, "limit": limit})
        rows = [JournalRow(row["journal"], row["position"], row["entry"]) for row in reversed(found)]
        return (0 if length is None else int(length["entries"])), rows

    def list_tasks(
        self,
        *,
        state: TaskState | None = None,
        tenant: str | None = None,
        definition: str | None = None,
        parent: str | None = None,
        limit: int = 100,
        queue: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> list[TaskRecord]:
        """Tasks matching every given filter, oldest first; ``parent``: the children of
        that task; ``queue``: the tasks of that named queue; ``attributes``: the tasks
        whose search attributes (``ctx.set_attributes``) include each of these, of the
        same kind and value (``{"customer": "c-42", "amount": 120}``)."""
        filters = checks.list_filters(state, tenant, definition, parent, limit, queue, attributes)
        found = self.dialect.all("list_tasks" if parent is None else "list_children", filters)
        return self.explain_reasons(
            [row_records.found_task(self.dialect, row, row["task_id"]) for row in found]
        )

    def list_tasks_page(
        self,
        *,
        after: str | None = None,
        limit: int = 50,
        scan: int = MAX_PAGE_SCAN,
        newest_first: bool = False,
        **filters: Unpack[TaskFilters],
    ) -> TaskPage:
        """A page of the tasks matching every given filter (as :meth:`list_tasks`), in
        creation order, after the cursor ``after`` (the ``next_after`` of the page
        before; None for the first page). Keyset paging on (created_at, task_id): a
        page costs its own rows however deep into the table it is, and tasks enqueued
        meanwhile neither repeat nor shift a page.

        A page looks through at most ``scan`` tasks after its cursor (``limit`` of them
        at least): when fewer than ``limit`` of those match, it holds the ones that do
        (maybe none) and ``next_after`` continues after the last task it looked at. So a
        filter few tasks match costs each page ``scan`` rows, never the whole table;
        ``next_after`` is None only once the walk reached the newest task.

        ``newest_first`` walks the other way: pages of the newest tasks first, each
        cursor going on with older ones."""
        unknown = sorted(set(filters) - set(TaskFilters.__annotations__))
        if unknown:
            raise TypeError(f"list_tasks_page() got an unexpected keyword argument {unknown[0]!r}")
        params = checks.list_filters(
            filters.get("state"),
            filters.get("tenant"),
            filters.get("definition"),
            filters.get("parent"),
            limit,
            filters.get("queue"),
            filters.get("attributes"),
        )
        scan = validate.integer("page scan", scan, minimum=limit, maximum=100 * MAX_PAGE_SCAN)
        validate.flag("newest_first", newest_first)
        after_at, after_id = _parse_cursor(after, newest_first)
        way = "_newest" if newest_first else ""
        d = self.dialect
        window = {"after_at": d.db_time(after_at), "after_id": after_id, "scan": scan}
        # One more than shown: whether a next page starts with a match.
        found = d.all(f"list_tasks_page{way}", params | window | {"limit": limit + 1})
        records = [row_records.found_task(d, row, row["task_id"]) for row in found[:limit]]
        if len(found) > limit:
            next_after: str | None = page_cursor(records[-1])
        else:  # every match of the window is here: go on after it, if tasks follow it
            ends = d.all(f"task_window_end{way}", window)
            last = ends[0] if len(ends) == 2 else None
            next_after = None if last is None else _cursor(d.time(last["created_at"]), last["task_id"])
        return TaskPage(self.explain_reasons(records), next_after)

    def finished_per_interval(self, span: timedelta, intervals: int) -> list[FinishedInterval]:
        """How many tasks finished in each of ``intervals`` equal intervals of the
        ``span`` that ends now (store time), oldest first: the overview's throughput.
        Counted from the history (its completed, failed and cancelled events), so a task
        that failed, was retried and failed again counts at each end."""
        validate.positive_duration("throughput span", span)
        intervals = validate.integer("throughput intervals", intervals, minimum=1, maximum=MAX_INTERVALS)
        d = self.dialect
        width = span / intervals
        since = self.now() - span
        counts: dict[int, dict[str, int]] = {n: {} for n in range(intervals)}
        params = {"since": d.db_time(since), "interval": d.db_duration(width)}
        for row in d.all("finished_per_interval", params):
            bucket = min(max(int(row["bucket"]), 0), intervals - 1)
            kind = str(row["kind"])
            counts[bucket][kind] = counts[bucket].get(kind, 0) + int(row["tasks"])
        return [FinishedInterval(since + width * n, **counts[n]) for n in range(intervals)]

    def referenced_versions(self) -> list[VersionReference]:
        """Every definition version that unfinished or recoverable tasks reference: the
        versions a deploy must keep registered."""
        return [row_records.version_reference(row) for row in self.dialect.all("referenced_versions", {})]

    def routed_backlog(self) -> list[RoutedBacklog]:
        """Unfinished tasks per queue, definition version and step fingerprint, and how
        many are ready: what ``stats`` and the metrics exporter check against the live
        workers' queues and registries."""
        return [
            RoutedBacklog(
                r["queue"],
                r["definition_name"],
                int(r["definition_version"]),
                r["fingerprint"],
                int(r["tasks"]),
                int(r["ready"] or 0),
            )
            for r in self.dialect.all("routed_backlog", {})
        ]

    def queue_stats(self) -> list[QueueStats]:
        return [row_records.queue_stats(row) for row in self.dialect.all("queue_stats", {})]

    def history(self, task_id: str) -> list[TaskEvent]:
        found = self.dialect.all("task_events", {"task_id": validate.text("task id", task_id)})
        return [row_records.task_event(row, self.dialect) for row in found]

    # --- tenant admission ------------------------------------------------------------

    def set_tenant_policy(self, policy: TenantPolicy) -> None:
        """Store ``policy`` for its tenant, replacing any earlier one; claims on every
        worker apply it from their next claim."""
        validate.instance("policy", policy, TenantPolicy)
        budget = policy.budget
        params = {
            "tenant": policy.tenant,
            "max_leased": policy.max_leased,
            "budget_cost": None if budget is None else budget.cost,
            "budget_window": None if budget is None else self.dialect.db_duration(budget.window),
        }
        self.dialect.execute("set_tenant_policy", params)

    def tenant_admission(self) -> list[TenantAdmission]:
        """Every tenant with a policy and where it stands now, by tenant name."""
        return [
            row_records.tenant_admission(row, self.dialect)
            for row in self.dialect.all("tenant_admission", {})
        ]

    # --- worker registry -------------------------------------------------------------

    @timed
    def register_worker(
        self,
        worker_id: WorkerId,
        *,
        host: str,
        pid: int,
        definitions: Sequence[tuple[str, int] | tuple[str, int, str]],
        queues: Sequence[str] = ("default",),
    ) -> None:
        """Record a starting worker, the definition versions it serves ((name, version)
        or (name, version, step fingerprint)) and the queues it claims from."""
        params = {
            "worker_id": worker_id.value,
            "host": validate.text("host", host),
            "pid": validate.count("pid", pid),
            "definitions": json.dumps([list(d) for d in definitions]),
            "queues": json.dumps(sorted({validate.text("queue", q) for q in queues})),
        }
        self.dialect.execute("register_worker", params)

    def pool_waits(self) -> PoolWaits:
        """Requests for a connection (PostgreSQL's pool) or the database lock (SQLite)
        since the last call, and how long they waited."""
        return self.dialect.pool_waits()

    @timed
    def worker_seen(self, worker_id: WorkerId, pid: int) -> None:
        """Refresh ``last_seen`` of a running worker (its heartbeat thread calls this)."""
        self.dialect.execute("worker_seen", {"worker_id": worker_id.value, "pid": validate.count("pid", pid)})

    def worker_stopped(self, worker_id: WorkerId, pid: int) -> None:
        self.dialect.execute(
            "worker_stopped", {"worker_id": worker_id.value, "pid": validate.count("pid", pid)}
        )

    def workers(self) -> list[WorkerRecord]:
        return [row_records.worker_record(row, self.dialect) for row in self.dialect.all("list_workers", {})]

    # --- time and lifecycle ----------------------------------------------------------

    def now(self) -> datetime:
        """Store time, the only clock that decides expiry, timers and backoff."""
        row = retried(lambda: self.dialect.one("now", {}))
        assert row is not None
        return self.dialect.time(row["now"])

    def set_clock_offset(self, offset: timedelta) -> None:
        """Shift store time for every process using this database (tests and drills)."""
        offset = validate.any_duration("clock offset", offset)
        self.dialect.execute("set_clock_offset", {"offset": self.dialect.db_duration(offset)})

    def clock_reading(self) -> ClockReading:
        """Store now, the clock offset and the next due time together: what a test needs
        to move store time to the next timer (``runifold_sync.testing``), since the
        offset ``set_clock_offset`` takes is absolute."""
        row = self.dialect.one("clock_reading", {})
        assert row is not None
        d = self.dialect
        due = row["next_due"]
        return ClockReading(
            d.time(row["now"]), d.duration(row["clock_offset"]), None if due is None else d.time(due)
        )

    def migrate(self) -> int:
        """Apply pending schema migrations (safe when several processes start at once);
        returns the schema version."""
        return self.dialect.migrate()

    def close(self) -> None:
        """Idempotent. In a forked child it only marks the store closed: the parent's
        connections must not be touched from there."""
        self.dialect.close()

    def explain_reasons(self, records: list[TaskRecord]) -> list[TaskRecord]:
        """``records`` with a ``status_note`` on every unfinished task that needs one: a
        ready task a claim skips for admission gets that hold, and a queued or leased
        task with no stored reason says whether it is due, scheduled or running where.
        While any worker is live, a task none of them can claim (its queue, its version,
        or the steps its checkpoint was written by) says so first; with none live the
        whole fleet is down, and a due task says "no worker is live" (``workers`` lists
        the fleet). ``reason`` stays what the store recorded."""
        unfinished = (TaskState.QUEUED, TaskState.WAITING, TaskState.LEASED)
        if not any(r.state in unfinished for r in records):
            return records
        admissions = {a.policy.tenant: a for a in self.tenant_admission()}
        limited = bool(self.dialect.all("flow_limits", {}))
        live = [w for w in self.workers() if w.live(LIVE_WITHIN)]
        now = self.now()
        explained = []
        for record in records:
            note = None
            if live and record.state in unfinished and not _running(record, now):
                fingerprint = record.fingerprint if record.checkpoint_json is not None else None
                note = unserved_reason(
                    record.queue, record.definition_name, record.definition_version, fingerprint, live
                )
            if note is None:
                note = explain(record.state, record.ready_at, record.tenant, admissions)
            ready = record.ready_at is not None and record.ready_at <= now
            if note is None and limited and record.state in (TaskState.QUEUED, TaskState.WAITING) and ready:
                # The flow limit that holds it, read for its own groups only.
                note = sql_flow.hold_of(record, sql_flow.read_flow_groups(self.dialect, record))
            if note is None and record.reason is None and record.state in unfinished:
                note = _status(record, now, anyone_live=bool(live))
            explained.append(record if note is None else attrs.evolve(record, status_note=note))
        return explained
