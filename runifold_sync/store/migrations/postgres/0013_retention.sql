-- Version 13: retention (store.prune). The finished tasks in the order they were created,
-- so a prune reads only what it may delete and walks it with a cursor, however large the
-- table. Keyed on created_at, which nothing changes after the insert, not on updated_at:
-- every step commit changes updated_at, and an index on it would make those commits
-- non-HOT updates (a new entry in every index of the table for each step). A task last
-- changed before a cutoff was created before it too, so the created_at range bounds the
-- scan and updated_at is checked on the rows found.
CREATE INDEX runifold_tasks_finished ON runifold_tasks (created_at, task_id)
    WHERE state IN ('terminal', 'cancelled');
