-- Version 17, the part both dialects run as written (after each one's own 0017).
-- Every task in creation order: the dashboard's task list pages through it by keyset
-- ((created_at, task_id) after the last one shown), so a page reads its rows and no
-- more however many tasks are stored. Neither column changes after the insert, so no
-- step commit writes this index (and on PostgreSQL it leaves the heap-only updates of
-- step commits possible).
CREATE INDEX runifold_tasks_created ON runifold_tasks (created_at, task_id);

-- The events that end a task, by time: the overview's throughput of the last hour reads
-- only that hour. On the events table, which only grows by inserts, not on the tasks'
-- updated_at: every step commit changes that, and an index on it would be written (on
-- PostgreSQL, every index of the row would be) at every step.
CREATE INDEX runifold_events_ended ON runifold_events (at)
    WHERE kind IN ('completed', 'failed', 'cancelled');
