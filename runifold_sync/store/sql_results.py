"""What callers outside a workflow ask of a task's outcome, written once over a
:class:`~runifold_sync.store.dialect.Dialect`: :meth:`~ResultOperations.wait_for_task`
blocks until a task has finished, :meth:`~ResultOperations.get_event` reads (or waits
for) a value its workflow published with ``ctx.set_event``, and
:meth:`~ResultOperations.published_events` lists them all (``show``).

A wait reads the task once, and when that does not answer it, subscribes to the task's
changes (``Dialect.watch``: NOTIFY on PostgreSQL, the change counter on SQLite, see
``watch``) and reads it again before it blocks: a change committed between the first
read and the subscription is seen by the second read, one committed after it wakes the
watch. It reads again only when woken, never on a timer of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ..errors import EventNotFound, TaskNotFound, WaitTimedOut
from ..model import validate
from ..model.attributes import AttributeKind, AttributeValue
from ..model.attributes import decode as decode_attribute
from ..model.codec import from_json
from ..model.values import TaskState
from . import checks, row_records
from .dialect import Dialect
from .records import PublishedEvent, StreamRead, StreamValue, TaskRecord

# A task in one of these states runs no more: completed or failed (terminal), or cancelled.
FINISHED = (TaskState.TERMINAL, TaskState.CANCELLED)
_Found = TypeVar("_Found")


class ResultOperations:
    """Mixed into :class:`~runifold_sync.store.base.WorkflowStore`."""

    dialect: Dialect

    def wait_for_task(self, task_id: str, timeout: timedelta) -> TaskRecord:
        """The record of task ``task_id`` once it has finished (``terminal``, completed
        or failed, or ``cancelled``), blocking up to ``timeout`` for it to finish:
        :class:`WaitTimedOut` if it has not by then, :class:`TaskNotFound` at once for an
        unknown id. A failed task counts as finished, a recoverable one (an ambiguous
        effect) too: it runs again only once someone resolves it. Thread-safe: many
        threads may wait at once, on PostgreSQL over one LISTEN connection between them."""
        validate.text("task id", task_id)
        timeout_s = validate.duration("wait_for_task timeout", timeout).total_seconds()
        found = self._await(task_id, timeout_s, lambda: self._finished(task_id))
        if found is None:
            raise WaitTimedOut(task_id, timeout)
        return found

    def get_event(self, task_id: str, key: str, timeout: timedelta | None = None) -> Any:
        """The value (decoded JSON) task ``task_id`` last published as event ``key``
        (``ctx.set_event``). Without ``timeout`` it is read once, and an event not
        published yet is :class:`EventNotFound`; with one, the call blocks up to
        ``timeout`` for the event to appear and then raises :class:`WaitTimedOut`.
        :class:`TaskNotFound` at once for an unknown task."""
        validate.text("task id", task_id)
        validate.name("event key", key)
        if timeout is None:
            text = self._event_json(task_id, key)
            if text is None:
                raise EventNotFound(task_id, key)
            return from_json(text)
        timeout_s = validate.duration("get_event timeout", timeout).total_seconds()
        text = self._await(task_id, timeout_s, lambda: self._event_json(task_id, key))
        if text is None:
            raise WaitTimedOut(task_id, timeout, key)
        return from_json(text)

    def published_events(self, task_id: str) -> list[PublishedEvent]:
        """Every event task ``task_id`` has published, by key; empty for a task that has
        published none (or does not exist)."""
        d = self.dialect
        published = []
        for row in d.all("published_events", {"task_id": validate.text("task id", task_id)}):
            text = d.json_out(row["value"])
            assert text is not None  # the column is NOT NULL; JSON null is the text "null"
            published.append(PublishedEvent(task_id, row["key"], text, d.time(row["set_at"])))
        return published

    def task_attributes(self, task_id: str) -> dict[str, AttributeValue]:
        """The search attributes task ``task_id`` has set (``ctx.set_attributes``), by
        key, each as the kind it was set as; empty for a task that set none (or does not
        exist)."""
        found = self.dialect.all("task_attributes", {"task_id": validate.text("task id", task_id)})
        return {row["key"]: decode_attribute(AttributeKind(row["kind"]), row["value"]) for row in found}

    def read_stream(
        self,
        task_id: str,
        key: str,
        *,
        after: int = 0,
        timeout: timedelta | None = None,
        limit: int = 1000,
    ) -> StreamRead:
        """The values task ``task_id`` appended to stream ``key`` (``ctx.write_stream``)
        after position ``after`` (0: from the first), in order, at most ``limit``.
        Without ``timeout`` it reads once; with one, when nothing follows ``after`` yet
        and the task has not finished, it blocks up to ``timeout`` for a value or the
        task's end, and returns what it then has (maybe nothing). ``closed`` says the
        task has finished (completed, failed or cancelled): what ``values`` holds is the
        rest of the stream. :class:`TaskNotFound` at once for an unknown task."""
        validate.text("task id", task_id)
        validate.name("stream key", key)
        after = validate.stored_int("stream offset after", after, minimum=0)
        limit = validate.integer("stream read limit", limit, minimum=1, maximum=checks.MAX_LIST_LIMIT)
        if timeout is None:
            return self._stream(task_id, key, after, limit)
        timeout_s = validate.duration("read_stream timeout", timeout).total_seconds()
        found = self._await(task_id, timeout_s, lambda: self._stream_news(task_id, key, after, limit))
        return found if found is not None else StreamRead([], False, after)

    def _stream(self, task_id: str, key: str, after: int, limit: int) -> StreamRead:
        """The stream as stored now: the task's state read first, so that a task seen
        finished has written everything the read after it finds."""
        d = self.dialect
        task = d.one("select_task", {"task_id": task_id})
        finished = row_records.found_task(d, task, task_id).state in FINISHED
        rows = d.all("read_stream", {"task_id": task_id, "key": key, "after": after, "limit": limit})
        values = [StreamValue(int(r["position"]), from_json(d.json_out(r["value"]) or "null")) for r in rows]
        closed = finished and len(values) < limit
        return StreamRead(values, closed, values[-1].position if values else after)

    def _stream_news(self, task_id: str, key: str, after: int, limit: int) -> StreamRead | None:
        """:meth:`_stream`, or None while it has nothing new and is open (a wait goes on)."""
        found = self._stream(task_id, key, after, limit)
        return found if found.values or found.closed else None

    def _finished(self, task_id: str) -> TaskRecord | None:
        row = self.dialect.one("select_task", {"task_id": task_id})
        record = row_records.found_task(self.dialect, row, task_id)
        return record if record.state in FINISHED else None

    def _event_json(self, task_id: str, key: str) -> str | None:
        """The JSON text of the event, None when the task has not published it."""
        row = self.dialect.one("task_event", {"task_id": task_id, "key": key})
        if row is None:
            raise TaskNotFound(task_id)
        return self.dialect.json_out(row["value"])

    def _await(self, task_id: str, timeout_s: float, look: Callable[[], _Found | None]) -> _Found | None:
        """What ``look`` finds, reading again each time the task's watch wakes; None once
        ``timeout_s`` has passed without it. Subscribes only when the first look finds
        nothing, so a finished task costs one read and no listening."""
        deadline = time.monotonic() + timeout_s
        found = look()
        if found is not None or timeout_s <= 0:
            return found
        with self.dialect.watch(task_id) as watch:
            while True:
                found = look()  # after subscribing: what committed before it is seen here
                if found is not None:
                    return found
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0:
                    return None
                watch.wait(remaining_s)
