-- Named queries both dialects run as written: standard SQL with no parameters (the two
-- drivers spell parameters differently) and no store time. Loaded before each dialect's
-- own file, which may not define a query of the same name.

-- name: routed_backlog
-- Unfinished tasks per (queue, name, version, fingerprint): what stats checks against the
-- live workers' queues and registries.
SELECT queue, definition_name, definition_version, fingerprint, COUNT(*) AS tasks
FROM runifold_tasks
WHERE state IN ('queued', 'leased', 'waiting')
GROUP BY queue, definition_name, definition_version, fingerprint
ORDER BY queue, definition_name, definition_version, fingerprint;
