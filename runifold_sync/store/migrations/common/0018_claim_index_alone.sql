-- Version 18, the part both dialects run as written (after each one's own 0018).
-- The idle wait's index of each route's due times, with one more term in its predicate,
-- "definition_version > 0", true of every row (versions start at 1): only a query that
-- states it (the idle wait) can use the index. The claim never does; it compares the
-- version with its routes', which the planner cannot prove positive. The term's column
-- never changes after the insert and is already a key of the index, so step commits stay
-- heap-only updates. On PostgreSQL, with statistics taken before a bulk enqueue (a new
-- table, or 20,000 queued beside a million finished tasks), the planner took this index
-- for the claim, read a route's whole backlog from it and sorted it: 98 ms of server CPU
-- a workflow, where runifold_tasks_routed, in claim order, reads as many rows as the
-- claim leases.
DROP INDEX runifold_tasks_routed_due;

CREATE INDEX runifold_tasks_routed_due ON runifold_tasks
    (queue, definition_name, definition_version, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL AND definition_version > 0;
