-- Version 24, the part both dialects run as written (after each one's own 0024).
-- The unfinished tasks with no due time (waiting for a signal or a child, paused):
-- queue_stats counts them here, the others from runifold_tasks_routed, and reads no
-- finished task. Only tasks in such a wait are written to it.
CREATE INDEX runifold_tasks_unready ON runifold_tasks (tenant)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NULL;
