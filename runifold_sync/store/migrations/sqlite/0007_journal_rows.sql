-- Version 7: each journal entry in a row of its own, so a step commit writes its new entry
-- instead of the whole checkpoint again; the task row keeps the checkpoint's head
-- (definition, run, phase, usage, undo), renamed from "checkpoint" to "head". The rename
-- also stops workers of the previous version that are still running: their statements
-- name the old column and fail (they retry as for an outage, and write nothing), instead
-- of reading a head as a whole checkpoint. Checkpoints of format version 1 are split into
-- rows here; one whose journals are not an array (and an object of arrays) stays as it
-- is and fails closed when claimed, as it did before.
ALTER TABLE runifold_tasks RENAME COLUMN checkpoint TO head;

CREATE TABLE runifold_journal (
    task_id TEXT NOT NULL,
    journal TEXT NOT NULL,
    position INTEGER NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (task_id, journal, position)
) WITHOUT ROWID;

CREATE TEMP TABLE runifold_convertible AS
SELECT task_id FROM runifold_tasks
WHERE json_valid(head) AND json_type(head) = 'object'
    AND json_extract(head, '$.format_version') = 1
    AND json_type(head, '$.journal') = 'array'
    AND COALESCE(json_type(head, '$.branch_journals'), 'object') = 'object'
    AND NOT EXISTS (
        SELECT 1 FROM json_each(head, '$.branch_journals') b WHERE b.type <> 'array'
    );

INSERT INTO runifold_journal (task_id, journal, position, entry)
SELECT t.task_id, '', j.key, j.value
FROM runifold_tasks t JOIN runifold_convertible c ON c.task_id = t.task_id, json_each(t.head, '$.journal') j;

INSERT INTO runifold_journal (task_id, journal, position, entry)
SELECT t.task_id, b.key, j.key, j.value
FROM runifold_tasks t JOIN runifold_convertible c ON c.task_id = t.task_id,
    json_each(t.head, '$.branch_journals') b, json_each(b.value) j;

UPDATE runifold_tasks
SET head = json_set(json_remove(head, '$.journal', '$.branch_journals'), '$.format_version', 2)
WHERE task_id IN (SELECT task_id FROM runifold_convertible);

DROP TABLE runifold_convertible;
