"""What the worker and the replay engine tell tracing, without importing OpenTelemetry.

The engine knows nothing of any tracing library, as the worker knows nothing of metrics
(``observer.py``): a claim is run through a :class:`CycleTracer` when the worker has one
(``runifold_sync.ops.tracing`` is the OpenTelemetry one), and its steps, effects and waits
open spans through the :class:`ClaimSpans` that tracer hands the claim. Without a tracer
the claim gets :data:`NO_SPANS`, whose spans are one shared context manager that does
nothing, so tracing off costs a method call per body or wait, and never an import.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Protocol

from ..model.outcomes import RunOutcome
from ..store.records import ClaimedTask
from ..workflow.specs import StepSpec
from ..workflow.step_context import StepContext


class WaitSpan(Protocol):
    """The span of one look at a durable wait: told how it ended when it did not
    suspend (a suspend is seen as the exception leaving it)."""

    def ended(self, outcome: str) -> None: ...


class _NoSpan:
    """A span that records nothing: entered and left for every body and wait when
    tracing is off."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def ended(self, outcome: str) -> None:
        return None


_NO_SPAN = _NoSpan()


class ClaimSpans:
    """The spans of one claim's bodies and waits. These record nothing; a tracer's
    subclass opens a span for each, a child of the claim's cycle span."""

    def call(self, spec: StepSpec, context: StepContext) -> AbstractContextManager[object]:
        """Around one attempt of a step or effect body (not a replayed call): the span
        is current while the body runs, so the application's own spans nest under it;
        how it ended is seen from the exception leaving it (a retry, a failure)."""
        return _NO_SPAN

    def wait(self, kind: str, call_id: str) -> AbstractContextManager[WaitSpan]:
        """Around one look at a durable wait (``timer``, ``signal``, ``children``) that
        this claim found open: it ends ``ended(...)`` or suspends the task."""
        return _NO_SPAN


NO_SPANS = ClaimSpans()


class CycleTracer(Protocol):
    """Traces a worker's cycles: ``runifold_sync.ops.tracing.Tracing`` for OpenTelemetry."""

    def cycle(self, claimed: ClaimedTask, run: Callable[[ClaimSpans], RunOutcome]) -> RunOutcome:
        """Run the claim of ``claimed`` (``run``, given the claim's spans) inside its
        cycle span, and return its outcome."""
        ...

    def close(self) -> None:
        """Export what is still buffered: the worker is closing (a pool child before it
        exits, which skips ``atexit``)."""
        ...
