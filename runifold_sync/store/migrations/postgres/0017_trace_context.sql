-- Version 17: tracing (runifold_sync.tracing). The W3C traceparent of the span that was
-- current where the task was enqueued (NULL: none was), so that every claim of the task
-- continues that trace: each cycle's span is a child of the enqueuing span.
ALTER TABLE runifold_tasks ADD COLUMN trace_context TEXT;
