-- Two changes that take work off every task.
--
-- A task's first checkpoint write compared a cost of 0 with the NULL of no checkpoint,
-- found them distinct and ran the charge function for nothing: on every task, and on a
-- one-step task's only write. Usage that charged nothing no longer fires the trigger;
-- the function still charges only what grew.
DROP TRIGGER runifold_tasks_charge ON runifold_tasks;

CREATE TRIGGER runifold_tasks_charge AFTER UPDATE OF checkpoint ON runifold_tasks FOR EACH ROW
    WHEN ((NEW.checkpoint -> 'usage' -> 'cost') IS DISTINCT FROM (OLD.checkpoint -> 'usage' -> 'cost')
        AND (NEW.checkpoint -> 'usage' -> 'cost') IS DISTINCT FROM '0'::jsonb)
    EXECUTE FUNCTION runifold_charge_tenant();

-- History is only ever read by task, in event order: the (task_id, event_id) index
-- becomes the primary key, and each event insert updates one index instead of two.
ALTER TABLE runifold_events DROP CONSTRAINT runifold_events_pkey;

DROP INDEX runifold_events_task;

ALTER TABLE runifold_events ADD PRIMARY KEY (task_id, event_id);
