-- Version 14: pause and resume (store.pause, store.resume). Who paused a task and why,
-- NULL when it is not paused. A paused task is never claimed; a leased one learns of the
-- pause from its next checkpoint commit or heartbeat and parks at that step boundary.
ALTER TABLE runifold_tasks ADD COLUMN paused TEXT;
