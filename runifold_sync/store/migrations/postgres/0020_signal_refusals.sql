-- Version 20: the signals refused where they were sent (store.send_signal: the pending
-- cap reached, a finished task, another tenant's sender, a name or decision the task's
-- definition refuses), counted on the task. Its history records only the first few, so
-- a flood of refused signals grows this count, not the history (10,000 to one task had
-- left 10,003 events and a 7.7 MB dashboard page). Adding a column with a constant
-- default rewrites no row.
ALTER TABLE runifold_tasks ADD COLUMN refused_signals bigint NOT NULL DEFAULT 0;
