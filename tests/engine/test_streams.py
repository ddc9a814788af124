"""Streams on every backend: ``ctx.write_stream`` appends values a caller reads in order
with ``store.read_stream(task_id, key, after=offset, timeout=...)``, each committed with
the progress made before it; a replayed call appends nothing; the stream is closed once
the task finishes, which a reader sees. A reader blocking for the next value is woken by
its commit (NOTIFY on PostgreSQL, the change counter on SQLite). (A worker killed around
a value's commit is in ``tests/system/test_attribute_stream_update_crash_points.py``: it is appended
once.)"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import attrs
import pytest

from runifold_sync import (
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowStore,
    WorkflowTask,
)
from runifold_sync.errors import InvalidArgument, LeaseLostError, TaskNotFound
from runifold_sync.outcomes import Completed, Suspended
from runifold_sync.store.records import StreamRead, StreamValue, StreamWrite
from tests.support.backends import Backend, contract_backend
from tests.support.clock import Clock
from tests.support.workers import run_cycle

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

LEASE = LeaseDuration(timedelta(seconds=30))

report = Workflow("report", 1)


@report.step()
def chapter(ctx: StepContext, n: int) -> str:
    return f"chapter {n}"


@report.main
def report_main(ctx: WorkflowContext, chapters: int) -> str:
    for n in range(1, chapters + 1):
        ctx.write_stream("progress", {"chapter": chapter(ctx, n)})
    ctx.sleep(timedelta(minutes=5))
    ctx.write_stream("progress", "bound")
    return "done"


def run_once(store: WorkflowStore, *workflows: Workflow) -> Any:
    return run_cycle(store, *(WorkflowDefinition(w) for w in workflows or (report,)), worker_id="w1")


def test_values_are_read_in_order_after_an_offset_and_the_end_closes_the_stream(
    backend: Backend, clock: Clock
) -> None:
    store = backend.open()
    store.enqueue(WorkflowTask.new("report", 1, 3, checkpoint_id="r1"))
    assert store.read_stream("r1", "progress") == StreamRead([], False, 0)
    assert isinstance(run_once(store), Suspended)
    chapters = [StreamValue(n, {"chapter": f"chapter {n}"}) for n in (1, 2, 3)]
    assert store.read_stream("r1", "progress") == StreamRead(chapters, False, 3)
    assert store.read_stream("r1", "progress", after=1, limit=1) == StreamRead(chapters[1:2], False, 2)
    assert store.read_stream("r1", "progress", after=3) == StreamRead([], False, 3)
    assert store.read_stream("r1", "other") == StreamRead([], False, 0)

    clock.advance(timedelta(minutes=6))
    assert run_once(store) == Completed("r1", "done")  # the replay appends nothing again
    assert store.read_stream("r1", "progress") == StreamRead([*chapters, StreamValue(4, "bound")], True, 4)
    assert store.read_stream("r1", "progress", after=4) == StreamRead([], True, 4)
    # Exactly the limit left: closed only once a read sees past it.
    assert store.read_stream("r1", "progress", after=2, limit=2).closed is False
    # A finished task's stream answers at once, even with a timeout.
    started = time.monotonic()
    assert store.read_stream("r1", "progress", after=4, timeout=timedelta(seconds=5)).closed
    assert time.monotonic() - started < 2


def test_a_reader_waiting_for_the_next_value_is_woken_by_its_commit(backend: Backend) -> None:
    store = backend.open()
    reader = backend.open()  # another process's store, as a caller would have
    store.enqueue(WorkflowTask.new("report", 1, 1, checkpoint_id="r2"))
    found: list[StreamRead] = []
    waiting = threading.Thread(
        target=lambda: found.append(reader.read_stream("r2", "progress", timeout=timedelta(seconds=20)))
    )
    waiting.start()
    time.sleep(0.3)  # the reader is blocked by now
    started = time.monotonic()
    assert isinstance(run_once(store), Suspended)
    waiting.join(20)
    assert found == [StreamRead([StreamValue(1, {"chapter": "chapter 1"})], False, 1)]
    assert time.monotonic() - started < 10
    # Nothing new within the timeout: an empty read, offset as given.
    assert reader.read_stream("r2", "progress", after=1, timeout=timedelta(milliseconds=200)) == StreamRead(
        [], False, 1
    )


def test_bad_reads_are_refused_naming_the_argument(store: WorkflowStore) -> None:
    with pytest.raises(TaskNotFound):
        store.read_stream("nobody", "progress")
    store.enqueue(WorkflowTask.new("report", 1, 1, checkpoint_id="r3"))
    with pytest.raises(InvalidArgument, match="stream key must be non-empty"):
        store.read_stream("r3", "")
    with pytest.raises(InvalidArgument, match="stream offset after"):
        store.read_stream("r3", "progress", after=-1)
    with pytest.raises(InvalidArgument, match="stream read limit"):
        store.read_stream("r3", "progress", limit=0)
    with pytest.raises(InvalidArgument, match="read_stream timeout"):
        store.read_stream("r3", "progress", timeout=5)  # type: ignore[arg-type]


def test_bad_writes_are_refused_at_the_call(store: WorkflowStore) -> None:
    writer = Workflow("writer", 1)

    @writer.main
    def writer_main(ctx: WorkflowContext, _: None) -> list[str]:
        said = []
        for key, value in (("", 1), ("k", object()), ("k", "x" * 70_000)):
            try:
                ctx.write_stream(key, value)
            except InvalidArgument as exc:
                said.append(str(exc))

        def branch(inside: WorkflowContext) -> str:
            try:
                inside.write_stream("k", 1)
            except InvalidArgument as exc:
                return str(exc)
            return "written"

        said.append(ctx.parallel({"a": branch})["a"])
        return said

    store.enqueue(WorkflowTask.new("writer", 1, None, checkpoint_id="w1"))
    outcome = run_once(store, writer)
    assert isinstance(outcome, Completed)
    said = outcome.result
    assert "stream key must be non-empty" in said[0]
    assert "value of stream 'k'" in said[1] and "value of stream 'k'" in said[2]
    assert "write_stream is for the main function, not parallel branch 'parallel#1/a'" in said[3]
    assert store.read_stream("w1", "k") == StreamRead([], True, 0)


# --- from a step body ----------------------------------------------------------------

READER: list[WorkflowStore] = []
SEEN: list[list[Any]] = []

draft = Workflow("draft", 1)


@draft.step(retry=RetryPolicy(max_attempts=2, initial_backoff=timedelta(seconds=1)))
def write_pages(ctx: StepContext, pages: int) -> int:
    for page in range(1, pages + 1):
        ctx.write_stream("pages", f"page {page} (attempt {ctx.attempt})")
        if ctx.attempt == 1 and page == 2:
            raise ConnectionError("the first attempt fails after two pages")
    SEEN.append([v.value for v in READER[0].read_stream(ctx.task_id, "pages").values])
    return pages


@draft.main
def draft_main(ctx: WorkflowContext, pages: int) -> int:
    written = write_pages(ctx, pages)
    ctx.write_stream("pages", "bound")
    return written


def test_a_step_body_writes_values_readers_see_at_once_and_a_rerun_adds_only_the_rest(
    backend: Backend, clock: Clock
) -> None:
    store = backend.open()
    READER[:] = [backend.open()]
    SEEN.clear()
    store.enqueue(WorkflowTask.new("draft", 1, 3, checkpoint_id="d1"))
    outcomes = []
    for _ in range(4):
        outcome = run_once(store, draft)
        outcomes.append(outcome.kind)
        if isinstance(outcome, Completed):
            break
        clock.advance(timedelta(minutes=1))  # past the retry's backoff
    assert outcomes[-1] == "completed", outcomes
    # Attempt 2 wrote pages 1 and 2 again (not appended: attempt 1 had) and page 3.
    expected = ["page 1 (attempt 1)", "page 2 (attempt 1)", "page 3 (attempt 2)"]
    assert SEEN == [expected]  # seen by another store while the step ran, before its result
    read = store.read_stream("d1", "pages")
    assert [v.value for v in read.values] == [*expected, "bound"]
    assert [v.position for v in read.values] == [1, 2, 3, 4] and read.closed


def test_a_step_stream_write_under_a_lost_lease_is_refused(store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("draft", 1, 1, checkpoint_id="d2"))
    (claimed,) = store.claim(WorkerId.parse("w9"), LEASE)
    stale = attrs.evolve(claimed.lease, fencing_token=claimed.lease.fencing_token + 1)
    with pytest.raises(LeaseLostError):
        store.append_stream(stale, StreamWrite("pages", '"x"', 1, "write_pages#1", 1))
    store.append_stream(claimed.lease, StreamWrite("pages", '"x"', 1, "write_pages#1", 1))
    store.append_stream(claimed.lease, StreamWrite("pages", '"x"', 1, "write_pages#1", 1))  # again: no-op
    assert store.read_stream("d2", "pages") == StreamRead([StreamValue(1, "x")], False, 1)
