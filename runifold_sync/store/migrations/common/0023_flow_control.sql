-- Version 23, the part both dialects run as written (after each one's own 0023).
-- The tasks of a dedup key, newest first: a dedup window or a singleton looks here.
CREATE INDEX runifold_tasks_dedup ON runifold_tasks (dedup_key, created_at)
    WHERE dedup_key IS NOT NULL;

-- The queued task a debounced enqueue folds into.
CREATE INDEX runifold_tasks_debounce ON runifold_tasks (debounce_key)
    WHERE debounce_key IS NOT NULL AND state = 'queued';
