-- Version 12: schedules (Schedule, registry.add_schedule; runifold_sync/schedule_ticker.py).
-- One row per schedule name: its definition as the last worker that declared it had it
-- (cron or every_s, in timezone), the last tick whose task was created, and whether an
-- operator paused it. A tick's task and the row's last_tick are written in one
-- transaction; only ticks after active_since (the first declaration, or the last resume)
-- are created, so a new or resumed schedule does not run the ticks it was not there for.
-- Times are integer microseconds of store time.
CREATE TABLE runifold_schedules (
    name TEXT PRIMARY KEY,
    definition_name TEXT NOT NULL,
    definition_version INTEGER NOT NULL,
    cron TEXT,
    every_s INTEGER,
    timezone TEXT NOT NULL,
    input TEXT NOT NULL,
    active_since INTEGER NOT NULL,
    last_tick INTEGER,
    paused_at INTEGER,
    paused_by TEXT,
    paused_reason TEXT,
    declared_at INTEGER NOT NULL,
    changed_at INTEGER NOT NULL
);

-- What happened to each schedule: declared, changed (a worker declared another
-- definition), paused and resumed (with who and why). Ticks are in their tasks' history.
CREATE TABLE runifold_schedule_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    actor TEXT,
    reason TEXT,
    detail TEXT NOT NULL
);
CREATE INDEX runifold_schedule_events_name ON runifold_schedule_events (name, id);
