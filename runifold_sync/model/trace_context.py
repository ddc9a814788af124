"""The trace context a task is enqueued in, read without importing OpenTelemetry.

A task stores the W3C ``traceparent`` of the span current where it was enqueued
(``store/sql_operators.insert_tasks``), and every claim of it continues that trace
(``tracing.py``). No span can be current unless the application imported OpenTelemetry
itself, so this asks OpenTelemetry only when ``opentelemetry.trace`` is already loaded:
an application without it pays one dictionary lookup per enqueue, and importing
runifold_sync never imports it.
"""

from __future__ import annotations

import sys


def current_traceparent() -> str | None:
    """The ``traceparent`` header (``00-<trace id>-<span id>-<flags>``) of the span
    current in this thread, or None when there is none (or OpenTelemetry is not loaded).
    Only the W3C form is kept, whatever propagator the application configured: it is
    what ``tracing.py`` reads back, and what any tracing backend understands."""
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
