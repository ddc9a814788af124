-- Version 16: routing and named queues. A task belongs to a queue ('default' unless
-- enqueued with another), and a worker claims only tasks of its queues whose definition
-- version its registry serves and, once a task has a head, whose step fingerprint it
-- has. "fingerprint" is the fingerprint of the worker that last claimed the task while
-- it had no head (so the one its first checkpoint is written by); it is filled here from
-- the head of the tasks that can still run.
ALTER TABLE runifold_tasks ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';

ALTER TABLE runifold_tasks ADD COLUMN fingerprint TEXT;

UPDATE runifold_tasks SET fingerprint = json_extract(head, '$.definition.fingerprint')
WHERE head IS NOT NULL AND json_valid(head) AND (state <> 'terminal' OR outcome = 'failed');

-- The queues a worker claims from (JSON array of names; NULL: a worker of a release
-- without queues, which served 'default').
ALTER TABLE runifold_workers ADD COLUMN queues TEXT;

-- The claim's indexes follow in common/0016_routing.sql.
