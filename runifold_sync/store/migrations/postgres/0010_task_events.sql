-- Version 10: events a running workflow publishes (ctx.set_event) for callers to read
-- (store.get_event, show): one row per task and key, last write wins, stamped with the
-- store time of the write that set it. Nothing deletes them yet (retention is separate).
CREATE TABLE runifold_task_events (
    task_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value JSONB NOT NULL,
    set_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (task_id, key)
);
