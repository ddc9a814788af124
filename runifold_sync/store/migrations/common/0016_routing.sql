-- Version 16, the part both dialects run as written (after each one's own 0016).
-- The claim reads each (tenant, queue, name, version) it serves in claim order, so a
-- backlog it does not serve is never read; the idle wait reads the earliest due time per
-- (queue, name, version). They replace the indexes of the claim that took anything.
DROP INDEX runifold_tasks_claimable;

DROP INDEX runifold_tasks_due;

CREATE INDEX runifold_tasks_routed ON runifold_tasks
    (tenant, queue, definition_name, definition_version, priority DESC, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;

CREATE INDEX runifold_tasks_routed_due ON runifold_tasks
    (queue, definition_name, definition_version, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;
