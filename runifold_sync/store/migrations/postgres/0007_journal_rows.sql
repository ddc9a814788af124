-- Version 7: each journal entry in a row of its own, so a step commit writes its new entry
-- instead of the whole checkpoint again; the task row keeps the checkpoint's head
-- (definition, run, phase, usage, undo), renamed from "checkpoint" to "head". The rename
-- also stops workers of the previous version that are still running: their statements
-- name the old column and fail (they retry as for an outage, and write nothing), instead
-- of reading a head as a whole checkpoint. Checkpoints of format version 1 are split into
-- rows here; one whose journals are not an array (and an object of arrays) stays as it
-- is and fails closed when claimed, as it did before. Entries are text, not JSONB:
-- nothing queries inside them, and text is stored as written.
ALTER TABLE runifold_tasks RENAME COLUMN checkpoint TO head;

CREATE TABLE runifold_journal (
    task_id TEXT NOT NULL,
    journal TEXT NOT NULL,
    position INTEGER NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (task_id, journal, position)
);

CREATE OR REPLACE FUNCTION runifold_charge_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    grown DOUBLE PRECISION := runifold_checkpoint_cost(NEW.head)
        - COALESCE(runifold_checkpoint_cost(OLD.head), 0);
    window_length INTERVAL;
BEGIN
    SELECT budget_window INTO window_length FROM runifold_tenants WHERE tenant = NEW.tenant;
    IF window_length IS NOT NULL AND grown > 0 THEN
        INSERT INTO runifold_tenant_charges (tenant, at, cost) VALUES (NEW.tenant, NEW.updated_at, grown);
        DELETE FROM runifold_tenant_charges
        WHERE tenant = NEW.tenant AND at <= NEW.updated_at - window_length;
    END IF;
    RETURN NULL;
END
$$;

CREATE TEMPORARY TABLE runifold_convertible ON COMMIT DROP AS
SELECT task_id FROM runifold_tasks
WHERE jsonb_typeof(head) = 'object'
    AND head -> 'format_version' = '1'::jsonb
    AND jsonb_typeof(head -> 'journal') = 'array'
    AND COALESCE(jsonb_typeof(head -> 'branch_journals'), 'object') = 'object'
    AND NOT EXISTS (
        SELECT 1 FROM jsonb_each(COALESCE(head -> 'branch_journals', '{}'::jsonb)) b
        WHERE jsonb_typeof(b.value) <> 'array'
    );

INSERT INTO runifold_journal (task_id, journal, position, entry)
SELECT t.task_id, '', j.ordinality - 1, j.value::text
FROM runifold_tasks t JOIN runifold_convertible c ON c.task_id = t.task_id
    CROSS JOIN LATERAL jsonb_array_elements(t.head -> 'journal') WITH ORDINALITY AS j (value, ordinality);

INSERT INTO runifold_journal (task_id, journal, position, entry)
SELECT t.task_id, b.key, j.ordinality - 1, j.value::text
FROM runifold_tasks t JOIN runifold_convertible c ON c.task_id = t.task_id
    CROSS JOIN LATERAL jsonb_each(COALESCE(t.head -> 'branch_journals', '{}'::jsonb)) AS b (key, value)
    CROSS JOIN LATERAL jsonb_array_elements(b.value) WITH ORDINALITY AS j (value, ordinality);

UPDATE runifold_tasks
SET head = (head - 'journal' - 'branch_journals') || '{"format_version": 2}'::jsonb
WHERE task_id IN (SELECT task_id FROM runifold_convertible);
