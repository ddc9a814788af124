-- Version 11: child workflows (ctx.start_child, ctx.wait_child).
-- The task that started a task as its child, NULL for a task enqueued from outside. A
-- child's end (completed, failed, cancelled) wakes its parent in the same transaction
-- when the parent waits for that child (waiting_for_child), and cancelling a parent
-- cancels its unfinished children.
ALTER TABLE runifold_tasks ADD COLUMN parent_id TEXT;
ALTER TABLE runifold_tasks ADD COLUMN waiting_for_child TEXT;
CREATE INDEX runifold_tasks_parent ON runifold_tasks (parent_id) WHERE parent_id IS NOT NULL;
