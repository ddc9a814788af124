-- Tasks waiting for a signal without a timeout have no ready_at. SQLite sorts NULL first,
-- so every claim scanned past them; the claim indexes now leave them out, and a due-time
-- index serves wait_for_work.
DROP INDEX runifold_tasks_claimable;

CREATE INDEX runifold_tasks_claimable ON runifold_tasks (priority DESC, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;

CREATE INDEX runifold_tasks_due ON runifold_tasks (ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;
