-- Version 17, the part both dialects run as written (after each one's own 0017).
-- Every task in creation order: the dashboard's task list pages through it by keyset
-- ((created_at, task_id) after the last one shown), so a page reads its rows and no
-- more however many tasks are stored. Neither column changes after the insert, so no
-- step commit writes this index.
CREATE INDEX runifold_tasks_created ON runifold_tasks (created_at, task_id);

-- The finished tasks by when they finished (their last change): the overview's
-- throughput of the last hour reads only that hour. A finished task's row is no longer
-- written, so only its final transition adds an entry.
CREATE INDEX runifold_tasks_ended ON runifold_tasks (updated_at)
    WHERE state IN ('terminal', 'cancelled');
