-- Version 25, the part both dialects run as written (after each one's own 0025).
-- A group's claims in the order they are numbered: its last, and its first in a window.
DROP INDEX runifold_flow_claims_window;
CREATE INDEX runifold_flow_claims_window ON runifold_flow_claims (scope, name, at, seq);

-- The running tasks of a concurrency key, counted where a claim reads the key's tasks.
CREATE INDEX runifold_tasks_leased_key ON runifold_tasks (concurrency_key, lease_expires)
    WHERE state = 'leased' AND concurrency_key IS NOT NULL;
