-- Version 23: flow control by key (store/sql_flow.py). A task may carry a concurrency
-- key (the group its max_running counts in), a dedup key (dedup windows and singletons,
-- checked by the enqueue) and a debounce key (enqueues collapse into one queued task).
-- runifold_flow_limits holds the limits: one row per scope ('key': a key, or a prefix
-- ending in '*', each matching key its own group; 'definition' and 'queue': every task
-- of that name one group), with max_running (leased at once) and/or a rate
-- (rate_count claims per rate_period, counted in runifold_flow_claims).
ALTER TABLE runifold_tasks ADD COLUMN concurrency_key TEXT;

ALTER TABLE runifold_tasks ADD COLUMN dedup_key TEXT;

ALTER TABLE runifold_tasks ADD COLUMN debounce_key TEXT;

-- Tasks under debounce: their first enqueue, the cap of how long they may wait.
ALTER TABLE runifold_tasks ADD COLUMN debounce_until TIMESTAMPTZ;

CREATE TABLE runifold_flow_limits (
    scope TEXT NOT NULL CHECK (scope IN ('key', 'definition', 'queue')),
    target TEXT NOT NULL,
    max_running INTEGER CHECK (max_running >= 0),
    rate_count INTEGER CHECK (rate_count >= 1),
    rate_period INTERVAL CHECK (rate_period > INTERVAL '0'),
    set_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (scope, target),
    CHECK ((rate_count IS NULL) = (rate_period IS NULL)),
    CHECK (max_running IS NOT NULL OR rate_count IS NOT NULL)
);

-- The claims a rate limit counts: one row per claim of a task in a rated group.
CREATE TABLE runifold_flow_claims (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL
);

CREATE INDEX runifold_flow_claims_window ON runifold_flow_claims (scope, name, at);

CREATE INDEX runifold_flow_claims_at ON runifold_flow_claims (at);

-- A task's priority before age_priorities raised it (NULL: never raised).
ALTER TABLE runifold_tasks ADD COLUMN base_priority INTEGER;
