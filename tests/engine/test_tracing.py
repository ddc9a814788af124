"""OpenTelemetry tracing on each store, read back from the SDK's in-memory exporter: the
trace context current at enqueue is stored with the task and is the parent of every
claim's ``runifold.cycle`` span; steps, effects and waits are spans of their cycle with
the task's attributes and their outcome; errors are recorded; a child task continues its
parent's trace.

Each cycle runs on a new worker, so nothing comes from an earlier worker's memory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from runifold_sync import (
    LeaseDuration,
    RetryPolicy,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
)
from runifold_sync.ops.tracing import Tracing
from runifold_sync.outcomes import Completed, Failed, Retried, RunOutcome, Suspended
from tests.support.backends import Backend, contract_backend

# The store contract suite: ``backend`` (so ``store`` and ``clock``) runs on PgBouncer too.
backend = contract_backend

flow = Workflow("traced-order", 1, signals=["go"])


@flow.step()
def price(ctx: StepContext, value: int) -> int:
    return value * 2


@flow.effect(idempotent=True)
def charge(ctx: StepContext, cents: int) -> str:
    return f"charged {cents}"


@flow.main
def order(ctx: WorkflowContext, value: int) -> str:
    cents = price(ctx, value)
    ctx.sleep(timedelta(0))  # due at once: fired in the same claim
    ctx.wait_for_signal("go")
    return charge(ctx, cents)


failing = Workflow("traced-failing", 1)


@failing.step(retry=RetryPolicy(max_attempts=2, initial_backoff=timedelta(milliseconds=1)))
def flaky(ctx: StepContext) -> None:
    raise ValueError(f"attempt {ctx.attempt} failed")


@failing.main
def fail_twice(ctx: WorkflowContext, _input: None) -> None:
    flaky(ctx)


kid = Workflow("traced-kid", 1)


@kid.step()
def kid_step(ctx: StepContext) -> str:
    return "kid"


@kid.main
def kid_main(ctx: WorkflowContext, _input: None) -> str:
    return kid_step(ctx)


parent = Workflow("traced-parent", 1)


@parent.main
def parent_main(ctx: WorkflowContext, _input: None) -> str:
    result: str = ctx.run_child("traced-kid", 1, None, checkpoint_id="the-kid")
    return result


@pytest.fixture
def exported() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _cycle(store: WorkflowStore, provider: TracerProvider) -> RunOutcome:
    registry = WorkflowRegistry()
    for workflow in (flow, failing, kid, parent):
        registry.register(WorkflowDefinition(workflow))
    lease = LeaseDuration(timedelta(seconds=30))
    worker = WorkflowWorker(
        store, registry, WorkerId.parse("tracer"), lease, timedelta(seconds=5), tracer=Tracing(provider)
    )
    try:
        return worker.run_once()
    finally:
        worker.close()


def _named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def test_every_claim_continues_the_enqueuing_trace(
    backend: Backend, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    store = backend.open()
    with provider.get_tracer("app").start_as_current_span("enqueue order") as enqueuing:
        store.enqueue(WorkflowTask.new("traced-order", 1, 21, checkpoint_id="o1"))
    assert isinstance(_cycle(store, provider), Suspended)
    store.send_signal("o1", "go", None, signal_id="go-1", sender="ops")
    assert _cycle(store, provider) == Completed("o1", "charged 42")

    spans = exporter.get_finished_spans()
    origin = enqueuing.get_span_context()
    cycles = _named(spans, "runifold.cycle")
    assert len(cycles) == 2
    for number, cycle in enumerate(cycles, start=1):
        assert cycle.kind is SpanKind.CONSUMER
        assert cycle.context.trace_id == origin.trace_id
        assert _parent_id(cycle) == origin.span_id
        assert cycle.parent is not None and cycle.parent.is_remote  # read back from the store
        assert cycle.attributes is not None
        assert cycle.attributes["runifold.task_id"] == "o1"
        assert cycle.attributes["runifold.definition"] == "traced-order"
        assert cycle.attributes["runifold.version"] == 1
        assert cycle.attributes["runifold.fencing_token"] == number
        assert cycle.attributes["runifold.worker_id"] == "tracer"
    assert [c.attributes and c.attributes["runifold.outcome"] for c in cycles] == ["suspended", "completed"]
    first, second = (c.context.span_id for c in cycles)

    (step,) = _named(spans, "runifold.step price")  # the second claim replays it: no span
    assert _parent_id(step) == first
    assert step.attributes is not None
    assert step.attributes["runifold.attempt"] == 1
    assert step.attributes["runifold.fencing_token"] == 1
    assert step.attributes["runifold.outcome"] == "completed"
    assert step.status.status_code is StatusCode.UNSET
    (effect,) = _named(spans, "runifold.effect charge")
    assert _parent_id(effect) == second
    assert effect.attributes is not None
    assert effect.attributes["runifold.fencing_token"] == 2
    assert str(effect.attributes["runifold.idempotency_key"]).startswith("o1")

    (timer,) = _named(spans, "runifold.wait timer")
    assert timer.attributes is not None and timer.attributes["runifold.outcome"] == "fired"
    waits = _named(spans, "runifold.wait signal")
    assert [_parent_id(w) for w in waits] == [first, second]
    assert [w.attributes and w.attributes["runifold.outcome"] for w in waits] == ["suspended", "received"]
    assert all(w.status.status_code is StatusCode.UNSET for w in waits)


def test_a_failing_step_records_its_error_on_each_attempt_and_on_the_cycle(
    backend: Backend, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    store = backend.open()
    store.enqueue(WorkflowTask.new("traced-failing", 1, None, checkpoint_id="f1"))
    assert isinstance(_cycle(store, provider), Retried)
    time.sleep(0.05)  # past the retry's backoff
    assert isinstance(_cycle(store, provider), Failed)

    spans = exporter.get_finished_spans()
    cycles = _named(spans, "runifold.cycle")
    assert [c.parent for c in cycles] == [None, None]  # enqueued outside any span: roots
    attempts = _named(spans, "runifold.step flaky")
    assert [
        a.attributes and (a.attributes["runifold.attempt"], a.attributes["runifold.outcome"])
        for a in attempts
    ] == [
        (1, "retried"),
        (2, "failed"),
    ]
    for number, attempt in enumerate(attempts, start=1):
        assert attempt.status.status_code is StatusCode.ERROR
        (event,) = attempt.events
        assert event.name == "exception"
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == f"attempt {number} failed"
    retried, failed = cycles
    assert retried.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None and failed.attributes["runifold.failure_cause"] == "step_error"
    (event,) = failed.events
    assert event.attributes is not None and event.attributes["exception.type"] == "ValueError"
    assert "Traceback" in str(event.attributes["exception.stacktrace"])


def test_a_child_task_continues_its_parents_trace(
    backend: Backend, exported: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, exporter = exported
    store = backend.open()
    with provider.get_tracer("app").start_as_current_span("enqueue parent") as enqueuing:
        store.enqueue(WorkflowTask.new("traced-parent", 1, None, checkpoint_id="p1"))
    for expected in ("p1", "the-kid", "p1"):
        outcome = _cycle(store, provider)
        assert outcome.task_id == expected  # type: ignore[attr-defined]
    assert isinstance(outcome, Completed)

    spans = exporter.get_finished_spans()
    cycles = _named(spans, "runifold.cycle")
    assert {c.context.trace_id for c in cycles} == {enqueuing.get_span_context().trace_id}
    parent_first, kid_cycle, parent_again = cycles
    assert _parent_id(parent_first) == _parent_id(parent_again) == enqueuing.get_span_context().span_id
    assert _parent_id(kid_cycle) == parent_first.context.span_id  # started in the parent's cycle
    (kid_span,) = _named(spans, "runifold.step kid_step")
    assert _parent_id(kid_span) == kid_cycle.context.span_id
    (wait,) = [
        w for w in _named(spans, "runifold.wait children") if _parent_id(w) == parent_again.context.span_id
    ]
    assert wait.attributes is not None and wait.attributes["runifold.outcome"] == "ended"
