"""What tracing costs a worker: CPU and wall time per step of 5-step workflows run to
completion by one in-process worker on SQLite, without a tracer provider and with an SDK
provider whose batch processor hands spans to an exporter that drops them (the spans are
made, their attributes set and queued; the network is left out). Rounds alternate the
two, so a drift of the machine's speed falls on both.

``python benchmarks/tracing.py [--rounds 4] [--workflows 300]``
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from statistics import mean

from common import Row, arg_parser, enqueue_workflows, fresh_store, print_table, progress, registry
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from runifold_sync import LeaseDuration, WorkerId, WorkflowWorker, open_store
from runifold_sync.ops.tracing import Tracing
from runifold_sync.outcomes import Completed

STEPS = 5


class _Dropped(SpanExporter):
    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS


def measure(workflows: int, traced: bool) -> tuple[float, float, int]:
    """(CPU us per step, wall us per step, spans exported) of one run on a fresh store."""
    exporter = _Dropped()
    provider = None
    if traced:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    with fresh_store("sqlite") as url:
        store = open_store(url)
        lease = LeaseDuration(timedelta(seconds=30))
        worker = WorkflowWorker(
            store,
            registry(),
            WorkerId.parse("trace-0"),
            lease,
            timedelta(seconds=10),
            tracer=None if provider is None else Tracing(provider),
        )
        try:
            enqueue_workflows(store, workflows, STEPS, delay=None)
            worker.run_once(claim_next=True)  # warm up: connections, caches
            wall0, cpu0 = time.perf_counter(), time.process_time()
            for _ in range(workflows - 1):
                if not isinstance(worker.run_once(claim_next=True), Completed):
                    raise RuntimeError("a benchmark workflow did not complete")
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        finally:
            worker.close()  # flushes the spans
            store.close()
    steps = (workflows - 1) * STEPS
    return cpu / steps * 1e6, wall / steps * 1e6, exporter.spans


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--workflows", type=int, default=300)
    args = parser.parse_args()
    runs: dict[bool, list[tuple[float, float, int]]] = {False: [], True: []}
    for n in range(args.rounds):
        order = (False, True) if n % 2 == 0 else (True, False)
        for traced in order:
            progress(f"tracing: round {n + 1} of {args.rounds}, {'on' if traced else 'off'}")
            runs[traced].append(measure(args.workflows, traced))
    off_cpu, on_cpu = (mean(r[0] for r in runs[t]) for t in (False, True))
    off_wall, on_wall = (mean(r[1] for r in runs[t]) for t in (False, True))
    spans = runs[True][0][2]
    print_table(
        f"tracing, SQLite, one in-process worker, {args.workflows} workflows of {STEPS} steps, "
        f"{args.rounds} rounds",
        [
            Row(
                "CPU per step, tracing off -> on",
                f"{off_cpu:,.0f} us -> {on_cpu:,.0f} us",
                f"{on_cpu / off_cpu:.2f}x",
            ),
            Row(
                "wall per step, tracing off -> on",
                f"{off_wall:,.0f} us -> {on_wall:,.0f} us",
                f"{on_wall / off_wall:.2f}x",
            ),
            Row("spans exported per workflow (on)", f"{spans / args.workflows:.1f}"),
        ],
    )


if __name__ == "__main__":
    main()
