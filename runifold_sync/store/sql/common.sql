-- Named queries both dialects run as written: standard SQL with no parameters (the two
-- drivers spell parameters differently), and store time only as the {now} token, which
-- each dialect's loader replaces with its own expression (both compare it with their
-- stored times as they are). Loaded before each dialect's own file, which may not define
-- a query of the same name.

-- name: routed_backlog
-- Unfinished tasks per (queue, name, version, fingerprint), and how many of them are ready
-- (queued, due, not paused): what stats and the unserved gauges check against the live
-- workers' queues and registries.
WITH clock AS (SELECT {now} AS now)
SELECT queue, definition_name, definition_version, fingerprint, COUNT(*) AS tasks,
    SUM(CASE WHEN state = 'queued' AND paused IS NULL AND ready_at <= (SELECT now FROM clock)
        THEN 1 ELSE 0 END) AS ready
FROM runifold_tasks
WHERE state IN ('queued', 'leased', 'waiting')
GROUP BY queue, definition_name, definition_version, fingerprint
ORDER BY queue, definition_name, definition_version, fingerprint;

-- name: delete_expired_logins
DELETE FROM runifold_logins WHERE expires_at <= {now};
