"""Tracing's edges: the package never imports OpenTelemetry unless tracing is asked for,
works where it is not installed, parents the steps of parallel branches to their cycle,
and builds a pool child's provider from the standard ``OTEL_*`` variables."""

from __future__ import annotations

import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.errors import InvalidArgument
from runifold_sync.ops.tracing import Tracing
from runifold_sync.ops.tracing_env import exporter_entry_points, exporter_names, provider_from_env
from runifold_sync.outcomes import Completed
from runifold_sync.sqlite import SqliteWorkflowStore

# A workflow run to its end in a fresh interpreter, reporting what it imported.
_RUN = """
import sys
from datetime import timedelta
from runifold_sync import (
    LeaseDuration, StepContext, WorkerId, Workflow, WorkflowDefinition, WorkflowRegistry,
    WorkflowTask, WorkflowWorker, open_store,
)
flow = Workflow("plain", 1)

@flow.step()
def one(ctx: StepContext) -> int:
    return 1

@flow.main
def main(ctx, _input: None) -> int:
    return one(ctx)

registry = WorkflowRegistry()
registry.register(WorkflowDefinition(flow))
store = open_store("sqlite:///" + sys.argv[1])
store.enqueue(WorkflowTask.new("plain", 1, None))
worker = WorkflowWorker(store, registry, WorkerId.parse("w"), LeaseDuration(timedelta(seconds=30)))
print(type(worker.run_once()).__name__)
worker.close()
print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
"""

# Makes every import of opentelemetry fail, as where the extra is not installed.
_WITHOUT_OTEL = """
import sys
class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None
sys.meta_path.insert(0, NoOpenTelemetry())
"""


def _run(code: str, tmp_path: Path) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "store.db")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.splitlines()


def test_the_package_imports_no_opentelemetry_without_tracing(tmp_path: Path) -> None:
    assert _run(_RUN, tmp_path) == ["Completed", "[]"]


def test_the_package_works_where_opentelemetry_is_not_installed(tmp_path: Path) -> None:
    assert _run(_WITHOUT_OTEL + _RUN, tmp_path) == ["Completed", "[]"]


fan = Workflow("traced-fan", 1)


@fan.step()
def leg(ctx: StepContext, name: str) -> str:
    return name


@fan.main
def fan_main(ctx: WorkflowContext, _input: None) -> dict[str, str]:
    return ctx.parallel({name: (lambda c, n=name: leg(c, n)) for name in ("a", "b", "c")})


def test_the_steps_of_parallel_branches_are_spans_of_their_cycle(sqlite_store: SqliteWorkflowStore) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = WorkflowRegistry()
    registry.register(WorkflowDefinition(fan))
    sqlite_store.enqueue(WorkflowTask.new("traced-fan", 1, None, checkpoint_id="fan"))
    lease = LeaseDuration(timedelta(seconds=30))
    worker = WorkflowWorker(sqlite_store, registry, WorkerId.parse("w"), lease, tracer=Tracing(provider))
    try:
        assert worker.run_once() == Completed("fan", {"a": "a", "b": "b", "c": "c"})
    finally:
        worker.close()
    spans = exporter.get_finished_spans()
    (cycle,) = [s for s in spans if s.name == "runifold.cycle"]
    legs = [s for s in spans if s.name == "runifold.step leg"]
    assert len(legs) == 3
    assert {s.parent.span_id for s in legs if s.parent is not None} == {cycle.context.span_id}
    assert sorted(str(s.attributes and s.attributes["runifold.call_id"]) for s in legs) == [
        "parallel#1/a/leg#1",
        "parallel#1/b/leg#1",
        "parallel#1/c/leg#1",
    ]


def test_a_pool_childs_provider_comes_from_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SERVICE_NAME", "orders-worker")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    provider = provider_from_env()
    assert provider.resource.attributes["service.name"] == "orders-worker"
    provider.shutdown()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    provider_from_env().shutdown()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin-in-a-box")
    with pytest.raises(InvalidArgument, match="zipkin-in-a-box"):
        provider_from_env()


def test_otlp_is_the_exporter_of_the_otlp_protocol_variables_as_the_sdk_reads_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for variable in (
        "OTEL_TRACES_EXPORTER",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    ):
        monkeypatch.delenv(variable, raising=False)
    # the default: otlp, over HTTP, the otel extra's exporter, found and built by that name
    assert [e.name for e in exporter_entry_points()] == ["otlp_proto_http"]
    provider_from_env().shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert exporter_names() == ["otlp_proto_grpc"]
    with pytest.raises(InvalidArgument, match=r"names 'otlp' \(otlp_proto_grpc, by the OTLP protocol"):
        exporter_entry_points()  # not installed here
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    assert exporter_names() == ["otlp_proto_http"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")  # the per-signal one wins
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    assert exporter_names() == ["otlp_proto_grpc", "console"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(InvalidArgument, match=r"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is 'http/json'"):
        exporter_names()
