"""A traced supervisor for the tracing pool test: ``python -m tests.ops.tracing_app
--url URL --spans DIR``.

Each child builds its own tracer provider in the worker factory, after the fork, with a
batch processor that would not export for ten minutes on its own: every span reaches the
exporter only through the flush of the worker's ``close``. The exporter writes one JSON
line per span to ``DIR/<pid>.jsonl``, a file of each child's own. ``traced-pool`` runs
three steps. On SIGTERM the supervisor stops its children and prints its report.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowWorker,
    open_store,
)
from runifold_sync.model.cancellation import CancellationToken
from runifold_sync.ops.tracing import Tracing
from runifold_sync.pool.supervisor import WorkflowSupervisor, WorkflowSupervisorConfig

STEPS = 3
flow = Workflow("traced-pool", 1)


@flow.step()
def add(ctx: StepContext, value: int) -> int:
    return value + 1


@flow.main
def main_fn(ctx: WorkflowContext, value: int) -> int:
    for _ in range(STEPS):
        value = add(ctx, value)
    return value


class FileExporter(SpanExporter):
    """Appends each exported span to a file as one JSON line, flushed before it returns."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self._path.open("a") as out:
            for span in spans:
                parent = span.parent
                line = {
                    "name": span.name,
                    "trace_id": f"{span.context.trace_id:032x}",
                    "span_id": f"{span.context.span_id:016x}",
                    "parent_id": None if parent is None else f"{parent.span_id:016x}",
                    "attributes": dict(span.attributes or {}),
                    "pid": os.getpid(),
                }
                out.write(json.dumps(line) + "\n")
        return SpanExportResult.SUCCESS


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.ops.tracing_app")
    parser.add_argument("--url", required=True)
    parser.add_argument("--spans", required=True, type=Path)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    lease = LeaseDuration(timedelta(seconds=5))
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(flow))

    def factory(worker_id: WorkerId) -> WorkflowWorker:
        provider = TracerProvider()  # in the child, after the fork
        exporter = FileExporter(args.spans / f"{os.getpid()}.jsonl")
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
        return WorkflowWorker(
            open_store(args.url), registry, worker_id, lease, lease.value / 4, tracer=Tracing(provider)
        )

    config = WorkflowSupervisorConfig(args.concurrency).with_backoff(
        timedelta(seconds=0.01), timedelta(seconds=0.1)
    )
    report = WorkflowSupervisor(factory, config, base_id="traced").run(CancellationToken())
    print(json.dumps({"outcomes": report.outcomes, "restarts": report.restarts}), flush=True)


if __name__ == "__main__":
    main()
