-- The PostgreSQL schema mirrors SQLite's column for column, with native types:
-- timestamptz for store times, JSONB for input, checkpoint, result and event detail, so
-- operators can query them. JSONB reorders keys and normalizes numbers, so the input is
-- also kept as the exact canonical text it was enqueued with (input_text): enqueue
-- idempotency compares that text, and workers receive it unchanged.
CREATE TABLE runifold_tasks (
    task_id TEXT PRIMARY KEY,
    definition_name TEXT NOT NULL,
    definition_version BIGINT NOT NULL,
    tenant TEXT NOT NULL,
    input JSONB NOT NULL,
    input_text TEXT NOT NULL,
    priority BIGINT NOT NULL DEFAULT 0,
    state TEXT NOT NULL CHECK (state IN ('queued', 'leased', 'waiting', 'terminal', 'cancelled')),
    outcome TEXT CHECK (outcome IN ('completed', 'failed')),
    reason TEXT,
    ambiguous_effect TEXT,
    ready_at TIMESTAMPTZ,
    worker_id TEXT,
    fencing_token BIGINT NOT NULL DEFAULT 0,
    lease_expires TIMESTAMPTZ,
    claims_since_progress INTEGER NOT NULL DEFAULT 0,
    revision BIGINT NOT NULL DEFAULT 0,
    checkpoint JSONB,
    result JSONB,
    created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL
);

-- Claims read only unfinished rows: these partial indexes stay as small as the live
-- queue however many finished tasks the table keeps. The first serves the claim's
-- ORDER BY, the second the earliest due time that wait_for_work sleeps until.
CREATE INDEX runifold_tasks_claimable ON runifold_tasks (priority DESC, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased');

CREATE INDEX runifold_tasks_due ON runifold_tasks (ready_at)
    WHERE state IN ('queued', 'waiting', 'leased');

CREATE TABLE runifold_events (
    event_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL,
    kind TEXT NOT NULL,
    worker_id TEXT,
    fencing_token BIGINT,
    detail JSONB NOT NULL DEFAULT '{}'
);

CREATE INDEX runifold_events_task ON runifold_events (task_id, event_id);

CREATE TABLE runifold_effect_resolutions (
    task_id TEXT NOT NULL,
    effect_key TEXT NOT NULL,
    applied BOOLEAN NOT NULL,
    result JSONB,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    resolved_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (task_id, effect_key)
);

-- Store time is clock_timestamp() plus this offset, shared by every process on the
-- database so tests and drills can move time forward without sleeping.
CREATE TABLE runifold_clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    offset_s DOUBLE PRECISION NOT NULL
);

INSERT INTO runifold_clock (id, offset_s) VALUES (1, 0.0);
