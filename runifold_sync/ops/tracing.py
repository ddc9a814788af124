"""OpenTelemetry tracing of workers: a span per cycle, and per step, effect and wait.

Importing this module imports OpenTelemetry (the ``otel`` extra); nothing else in the
package does. A worker is handed a tracer, ``WorkflowWorker(..., tracer=Tracing(provider))``
(or an ``App`` a function building one, ``App(..., tracer=tracing_env.tracer_from_env)``):
the worker knows only the small protocol of ``engine/spans.py``.

Each claim is one ``runifold.cycle`` span (kind CONSUMER), a child of the span that was
current where the task was enqueued (its stored ``traceparent``, ``trace_context.py``), so
every claim of a task, across timers, retries and workers, lands in the enqueuer's trace;
a child task started from a workflow is enqueued while its parent's cycle span is
current, and so continues that. Inside it each attempt of a step or effect body is a
span (``runifold.step <id>``, ``runifold.effect <id>``; replayed calls run nothing and get
none), and so is each look at a durable wait that is open (``runifold.wait timer``,
``signal``, ``approval``, ``children``). Every span carries the task's id, definition,
version, tenant and fencing token; ``runifold.outcome`` says how it ended. A body's error
is recorded on its span (``record_exception``, status ERROR), and a failed task's on its
cycle.

In a forked pool nothing of OpenTelemetry may cross the fork: build the provider in the
worker factory, which runs in each child after the fork (``tracing_env.tracer_from_env``
builds one from the standard ``OTEL_*`` variables; ``runifold run --tracing`` does that). A
worker's ``close`` flushes its provider, so a child stopped gracefully loses no span (it
exits with ``os._exit``, which skips ``atexit``); a SIGKILLed child loses what it had not
exported.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..engine.interrupts import FailRequested, RetryRequested, SuspendRequested
from ..engine.spans import ClaimSpans, WaitSpan
from ..errors import InvalidArgument, StepFailed
from ..model import validate
from ..model.outcomes import Failed, LeaseLost, RunOutcome, Suspended
from ..store.records import ClaimedTask
from ..workflow.specs import StepSpec
from ..workflow.step_context import StepContext

SCOPE = "runifold_sync"
_W3C = TraceContextTextMapPropagator()  # the stored form, whatever the app's propagator is
Attributes = Mapping[str, str | int]


class Tracing:
    """Traces a worker's cycles with ``tracer_provider`` (pass
    ``opentelemetry.trace.get_tracer_provider()`` for the global one): the
    :class:`~runifold_sync.engine.spans.CycleTracer` a ``WorkflowWorker`` is handed."""

    def __init__(self, tracer_provider: TracerProvider) -> None:
        if not isinstance(tracer_provider, TracerProvider):  # else an AttributeError, later
            raise InvalidArgument(
                f"tracer_provider must be an OpenTelemetry TracerProvider, "
                f"got {validate.shown(tracer_provider)}"
            )
        self._provider = tracer_provider
        self._tracer = tracer_provider.get_tracer(SCOPE)

    def cycle(self, claimed: ClaimedTask, run: Callable[[ClaimSpans], RunOutcome]) -> RunOutcome:
        """Run one claim inside its ``runifold.cycle`` span, parented to the span current
        at enqueue (or, for a task enqueued outside any, to whatever span is current)."""
        lease = claimed.lease
        task: Attributes = {
            "runifold.task_id": lease.task_id,
            "runifold.definition": claimed.definition_name,
            "runifold.version": claimed.definition_version,
            "runifold.tenant": lease.tenant,
            "runifold.fencing_token": lease.fencing_token,
        }
        stored = claimed.trace_context
        parent = None if stored is None else _W3C.extract({"traceparent": stored})
        attributes = {
            **task,
            "runifold.worker_id": lease.worker_id,
            "runifold.from_state": claimed.from_state,
            "runifold.claims_since_progress": claimed.claims_since_progress,
        }
        span = self._tracer.start_span(
            "runifold.cycle", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
        )
        with _current(span):
            try:
                outcome = run(_Spans(self._tracer, task))
            except BaseException as exc:
                _ended(span, _interrupted(exc), exc)
                raise
            _cycle_ended(span, outcome)
            return outcome

    def close(self) -> None:
        """Export every span still buffered: the worker closes, and a pool child exits
        right after with ``os._exit``, which skips the SDK's ``atexit`` flush."""
        flush = getattr(self._provider, "force_flush", None)
        if flush is not None:
            flush()


class _Spans(ClaimSpans):
    """The spans of one claim, children of its cycle span (the current span where the
    body or wait runs: the worker's thread, or a parallel branch's, which is started in
    a copy of the main function's context)."""

    def __init__(self, tracer: Tracer, task: Attributes) -> None:
        self._tracer = tracer
        self._task = task

    def call(self, spec: StepSpec, context: StepContext) -> AbstractContextManager[object]:
        attributes = {
            **self._task,
            "runifold.step_id": spec.step_id,
            "runifold.call_id": context.call_id,
            "runifold.attempt": context.attempt,
        }
        if context.idempotency_key is not None:
            attributes["runifold.idempotency_key"] = context.idempotency_key
        return self._span(f"runifold.{spec.kind} {spec.step_id}", attributes, "completed")

    def wait(self, kind: str, call_id: str) -> AbstractContextManager[WaitSpan]:
        attributes = {**self._task, "runifold.wait": kind, "runifold.call_id": call_id}
        return self._span(f"runifold.wait {kind}", attributes, "done")

    @contextmanager
    def _span(self, name: str, attributes: Attributes, done: str) -> Iterator[_Ending]:
        span = self._tracer.start_span(name, attributes=attributes)
        ending = _Ending(done)
        with _current(span):
            try:
                yield ending
            except BaseException as exc:
                _ended(span, _interrupted(exc), exc)
                raise
        span.set_attribute("runifold.outcome", ending.outcome)
        span.end()


class _Ending:
    """How a body or wait ended without an exception: ``done`` unless told otherwise (a
    wait says whether it fired, received or timed out)."""

    def __init__(self, done: str) -> None:
        self.outcome = done

    def ended(self, outcome: str) -> None:
        self.outcome = outcome


def _current(span: Span) -> AbstractContextManager[Span]:
    """``span`` current while the block runs; how it ended is set here, not guessed by the
    SDK (the engine's interrupts are BaseExceptions, and most are no error)."""
    return trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


def _interrupted(exc: BaseException) -> str:
    """The outcome of a body or wait that ``exc`` left."""
    if isinstance(exc, RetryRequested):
        return "retried"
    if isinstance(exc, FailRequested | StepFailed):  # a step's final failure, raised to be caught
        return "failed"
    if isinstance(exc, SuspendRequested):
        return "suspended"
    if isinstance(exc, Exception):
        return "error"
    return "interrupted"  # a cancel, a stop, a lost lease found at the boundary


def _ended(span: Span, outcome: str, exc: BaseException) -> None:
    """End ``span`` left by ``exc``: an error when the attempt failed (its own error
    recorded) or something raised, not when the task suspends or is stopped."""
    span.set_attribute("runifold.outcome", outcome)
    if isinstance(exc, SuspendRequested) and exc.wake_at is not None:
        span.set_attribute("runifold.wake_at", exc.wake_at.isoformat())
    error = exc if isinstance(exc, Exception) else exc.__cause__ or getattr(exc, "error", None)
    if isinstance(exc, StepFailed) and isinstance(exc.__cause__, Exception):
        error = exc.__cause__  # the body's own error, as a failure without the catch recorded
    if isinstance(error, Exception):
        span.record_exception(error)
    if outcome in ("retried", "failed", "error"):
        reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
        span.set_status(Status(StatusCode.ERROR, reason))
    span.end()


def _cycle_ended(span: Span, outcome: RunOutcome) -> None:
    """The cycle span ends with the claim's outcome; a failed task or a lost lease is an
    error, its cause and traceback recorded as OpenTelemetry records an exception."""
    span.set_attribute("runifold.outcome", outcome.kind)
    if isinstance(outcome, Suspended):
        span.set_attribute("runifold.reason", outcome.reason)
    elif isinstance(outcome, Failed):
        span.set_attribute("runifold.failure_cause", outcome.cause)
        detail = outcome.error
        if detail is not None:
            event = {"exception.type": detail.error_class or "", "exception.message": detail.message}
            if detail.traceback is not None:
                event["exception.stacktrace"] = detail.traceback
            span.add_event("exception", event)
        span.set_status(Status(StatusCode.ERROR, outcome.reason))
    elif isinstance(outcome, LeaseLost):
        span.set_status(Status(StatusCode.ERROR, f"lease lost at {outcome.operation}"))
    span.end()
