-- Version 16: routing and named queues. A task belongs to a queue ('default' unless
-- enqueued with another), and a worker claims only tasks of its queues whose definition
-- version its registry serves and, once a task has a head, whose step fingerprint it
-- has. "fingerprint" is the fingerprint of the worker that last claimed the task while
-- it had no head (so the one its first checkpoint is written by); it is filled here from
-- the head of the tasks that can still run.
ALTER TABLE runifold_tasks ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';

ALTER TABLE runifold_tasks ADD COLUMN fingerprint TEXT;

UPDATE runifold_tasks SET fingerprint = head -> 'definition' ->> 'fingerprint'
WHERE head IS NOT NULL AND (state <> 'terminal' OR outcome = 'failed');

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

-- The queues a worker claims from (JSON array of names; NULL: a worker of a release
-- without queues, which served 'default').
ALTER TABLE runifold_workers ADD COLUMN queues JSONB;
