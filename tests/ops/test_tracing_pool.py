"""A forked pool exporting spans for every step of 10 workflows, each parented to the span
that enqueued its task, with zero spans lost on graceful shutdown (on SQLite and
PostgreSQL). The children build their providers after the fork, and their exporters
export only when the worker's close flushes them, so every span read back came through
that flush."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from runifold_sync import WorkflowTask
from runifold_sync.store import TaskState
from tests.support import processes
from tests.support.backends import Backend

from . import tracing_app

WORKFLOWS = 10


@pytest.fixture
def pool() -> Iterator[list[subprocess.Popen[str]]]:
    with processes.reaped() as started:
        yield started


def _spans(folder: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for path in sorted(folder.glob("*.jsonl")) for line in path.read_text().splitlines()
    ]


@pytest.mark.timeout(90)
def test_a_pool_exports_every_steps_span_in_the_enqueuers_trace_and_loses_none_on_sigterm(
    backend: Backend, tmp_path: Path, pool: list[subprocess.Popen[str]]
) -> None:
    store = backend.open()
    tracer = TracerProvider().get_tracer("producer")
    enqueued: dict[str, tuple[str, str]] = {}  # task id -> (trace id, span id) of its enqueue
    for n in range(WORKFLOWS):
        task_id = f"traced-{n}"
        with tracer.start_as_current_span(f"enqueue {task_id}") as span:
            store.enqueue(WorkflowTask.new("traced-pool", 1, n, checkpoint_id=task_id))
        context = span.get_span_context()
        enqueued[task_id] = (f"{context.trace_id:032x}", f"{context.span_id:016x}")
    folder = tmp_path / "spans"
    folder.mkdir()
    proc = processes.spawn(
        "tests.ops.tracing_app", "--url", backend.url, "--spans", str(folder), own_session=True
    )
    pool.append(proc)
    processes.wait_until(
        lambda: all(store.get_task(t).state is TaskState.TERMINAL for t in enqueued),
        60,
        "every traced workflow to complete",
    )
    assert _spans(folder) == []  # nothing exported yet: the batches wait for the flush
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    report = json.loads(out.strip().splitlines()[-1])
    assert report["outcomes"]["completed"] == WORKFLOWS

    spans = _spans(folder)
    assert len({s["pid"] for s in spans}) >= 1
    cycles = [s for s in spans if s["name"] == "runifold.cycle"]
    steps = [s for s in spans if s["name"] == "runifold.step add"]
    assert len(cycles) == WORKFLOWS  # one claim each: nothing suspends
    assert len(steps) == WORKFLOWS * tracing_app.STEPS
    cycle_of = {}
    for cycle in cycles:
        task_id = cycle["attributes"]["runifold.task_id"]
        assert (cycle["trace_id"], cycle["parent_id"]) == enqueued[task_id]
        assert cycle["attributes"]["runifold.outcome"] == "completed"
        cycle_of[cycle["span_id"]] = cycle
    for step in steps:
        cycle = cycle_of[step["parent_id"]]
        assert step["trace_id"] == cycle["trace_id"]
        assert step["attributes"]["runifold.task_id"] == cycle["attributes"]["runifold.task_id"]
        assert step["attributes"]["runifold.outcome"] == "completed"
    per_task = sorted(
        (s["attributes"]["runifold.task_id"], s["attributes"]["runifold.call_id"]) for s in steps
    )
    assert len(set(per_task)) == len(per_task) == WORKFLOWS * tracing_app.STEPS
