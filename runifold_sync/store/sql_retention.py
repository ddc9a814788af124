"""Retention: deleting finished tasks once they are old, with every row that belongs to
them, written once over a :class:`~runifold_sync.store.dialect.Dialect`.

What is deleted: tasks that are finished (``terminal``, completed or failed, or
``cancelled``) and whose last change (``updated_at``) is older than store time minus
the cutoff, with their history (``runifold_events``), journal rows, signals, effect
resolutions and published events (``runifold_task_events``). Tenant charges are kept
per tenant, not per task, and go by their own window; definition declarations and the
tenants' rows are not per task either.

What is kept, and why:

- an unfinished task, always;
- a task failed on an ambiguous effect nobody resolved (``ambiguous_effect``), unless
  ``include_ambiguous``: it waits for an operator's decision (``resolve_effect``), and
  deleting it would lose the record of an external write that may have happened;
- a finished parent with an unfinished child, until the child has finished: the child's
  end wakes its parent and names it in its history, and ``show`` lists the family;
- a child while its parent is still stored, finished or not: a parent that an operator
  requeues (``requeue``, ``resolve_effect``) replays its ``wait_child``, which reads its
  children. A child goes with its parent, in the same batch, or after it.

How: in batches of at most ``batch`` tasks, each its own short transaction, walking the
finished tasks in creation order (index ``runifold_tasks_finished``) with a cursor, so a
prune reads each candidate once however many it keeps. A child is created after its
parent, so the walk meets a parent first and decides it before its children. On
PostgreSQL a batch locks its rows ``FOR UPDATE SKIP LOCKED``: it never waits for a
worker or an operator, and a row someone holds is left for the next prune. Workers
never touch a finished task's rows, so nothing waits for a prune either. On SQLite a
batch is one ``BEGIN IMMEDIATE`` transaction, as every write is.

The cutoff is fixed when a prune starts, so a long prune does not chase it. Once a task
is deleted its id is free: enqueueing it again creates a new task (``enqueue``'s
idempotency holds only while the task is stored).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ..model import validate
from . import checks
from .dialect import Dialect, Row, Transaction

# The cursor before the first finished task: earlier than any store time.
_START = datetime(1, 1, 1, tzinfo=UTC)


class RetentionOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect

    def prune(
        self,
        older_than: timedelta,
        *,
        batch: int = 1000,
        include_ambiguous: bool = False,
        dry_run: bool = False,
    ) -> int:
        """Delete finished tasks last changed more than ``older_than`` ago (store time),
        with all their rows, in transactions of at most ``batch`` tasks; returns how many
        were deleted, or with ``dry_run`` how many would be (nothing is deleted). What is
        kept and why: the module docstring. Safe while pools run."""
        return sum(
            self.prune_batches(older_than, batch=batch, include_ambiguous=include_ambiguous, dry_run=dry_run)
        )

    def prune_batches(
        self,
        older_than: timedelta,
        *,
        batch: int = 1000,
        include_ambiguous: bool = False,
        dry_run: bool = False,
    ) -> Iterator[int]:
        """:meth:`prune` one batch at a time: each ``next()`` runs one transaction and
        gives how many tasks it deleted (or would), until the walk is done. For callers
        that report progress or pace themselves (the CLI, a pool's retention); stopping
        early leaves the rest for the next prune. Arguments are checked here, at once."""
        validate.duration("older_than", older_than)
        limit = validate.integer("prune batch", batch, minimum=1, maximum=checks.MAX_PRUNE_BATCH)
        for name, flag in (("include_ambiguous", include_ambiguous), ("dry_run", dry_run)):
            if not isinstance(flag, bool):
                validate.refuse(name, "True or False", flag)
        return self._walk(older_than, limit, include_ambiguous, dry_run)

    def _walk(
        self, older_than: timedelta, limit: int, include_ambiguous: bool, dry_run: bool
    ) -> Iterator[int]:
        d = self.dialect
        now = d.one("now", {})
        assert now is not None
        params: dict[str, Any] = {
            "cutoff": d.db_time(d.time(now["now"]) - older_than),
            "include_ambiguous": include_ambiguous,
            "limit": limit,
            "after_at": d.db_time(_START),
            "after_id": "",
        }
        gone: set[str] = set()  # parents deleted (or, in a dry run, counted) by this walk
        while True:
            with d.transaction() as tx:
                found = tx.all("prune_candidates", params)
                chosen = _deletable(tx, d, found, gone)
                deleted = len(chosen)
                if chosen and not dry_run:
                    ids = {"ids": d.db_ids(chosen)}
                    for query in d.prune_queries:
                        deleted = tx.count(query, ids)
            yield deleted
            if len(found) < limit:
                return
            params |= {"after_at": found[-1]["created_at"], "after_id": found[-1]["task_id"]}


def _deletable(tx: Transaction, d: Dialect, found: Sequence[Row], gone: set[str]) -> list[str]:
    """The ids of ``found`` (candidates in creation order) that may go: none with an
    unfinished child, and each without a parent or with its parent gone (deleted
    earlier, or chosen before it here); the parents chosen join ``gone``."""
    if not found:
        return []
    ids = [row["task_id"] for row in found]
    families = {
        row["parent_id"]: bool(row["unfinished"]) for row in tx.all("prune_families", {"ids": d.db_ids(ids)})
    }
    waiting = {row["parent_id"] for row in found if row["parent_id"] is not None} - gone
    stored = set()
    if waiting:
        stored = {row["task_id"] for row in tx.all("stored_tasks", {"ids": d.db_ids(sorted(waiting))})}
    chosen = []
    for row in found:
        task_id, parent = row["task_id"], row["parent_id"]
        if families.get(task_id, False):
            continue  # a child of it is unfinished
        if parent is None or parent in gone or parent not in stored:
            chosen.append(task_id)
            if task_id in families:
                gone.add(task_id)
    return chosen
