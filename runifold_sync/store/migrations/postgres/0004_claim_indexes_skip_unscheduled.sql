-- Tasks waiting for a signal without a timeout have no ready_at and can never be claimed:
-- the claim and due-time indexes leave them out, so many such tasks cost claims nothing.
DROP INDEX runifold_tasks_claimable;

CREATE INDEX runifold_tasks_claimable ON runifold_tasks (priority DESC, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;

DROP INDEX runifold_tasks_due;

CREATE INDEX runifold_tasks_due ON runifold_tasks (ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;
