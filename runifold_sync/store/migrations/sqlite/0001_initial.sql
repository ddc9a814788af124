-- Times are store time in integer microseconds since the Unix epoch: exact, so a time the
-- store handed out compares equal when it comes back as a parameter.
-- Tasks: one row per checkpoint identity. ready_at is the store time at which the task
-- may next be claimed: not_before or backoff for queued tasks, the timer for waiting
-- ones, and the lease expiry for leased ones, so one index finds every claimable task.
CREATE TABLE runifold_tasks (
    task_id TEXT PRIMARY KEY,
    definition_name TEXT NOT NULL,
    definition_version INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    input TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL CHECK (state IN ('queued', 'leased', 'waiting', 'terminal', 'cancelled')),
    outcome TEXT CHECK (outcome IN ('completed', 'failed')),
    reason TEXT,
    ambiguous_effect TEXT,
    ready_at INTEGER,
    worker_id TEXT,
    fencing_token INTEGER NOT NULL DEFAULT 0,
    lease_expires INTEGER,
    claims_since_progress INTEGER NOT NULL DEFAULT 0,
    revision INTEGER NOT NULL DEFAULT 0,
    checkpoint TEXT,
    result TEXT,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE INDEX runifold_tasks_claimable ON runifold_tasks (priority DESC, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased');

CREATE TABLE runifold_events (
    event_id INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    kind TEXT NOT NULL,
    worker_id TEXT,
    fencing_token INTEGER,
    detail TEXT NOT NULL DEFAULT '{}'
);

CREATE INDEX runifold_events_task ON runifold_events (task_id, event_id);

CREATE TABLE runifold_effect_resolutions (
    task_id TEXT NOT NULL,
    effect_key TEXT NOT NULL,
    applied INTEGER NOT NULL,
    result TEXT,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    resolved_at INTEGER NOT NULL,
    PRIMARY KEY (task_id, effect_key)
);

-- Store time is SQL time plus this offset, shared by every process on the database so
-- tests and drills can move time forward without sleeping.
CREATE TABLE runifold_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    offset_us INTEGER NOT NULL
);

INSERT INTO runifold_clock (id, offset_us) VALUES (1, 0);
