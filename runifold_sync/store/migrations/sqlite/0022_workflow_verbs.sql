-- Version 22: workflow verbs (issue 48).
-- Search attributes (ctx.set_attributes): one row per task and key, last write wins, each
-- value as its kind and canonical text (model/attributes.py), so a filter
-- (list_tasks(attributes=...), list --where) is an equality on the index below.
CREATE TABLE runifold_task_attributes (
    task_id TEXT NOT NULL,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    value TEXT NOT NULL,
    set_at INTEGER NOT NULL,
    PRIMARY KEY (task_id, key)
);
CREATE INDEX runifold_task_attributes_value ON runifold_task_attributes (key, kind, value, task_id);

-- Schedules created at run time (store.create_schedule) beside the ones a registry
-- declares: origin 'declared' or 'created'; a created one keeps its queue here, since no
-- registry holds its definition.
ALTER TABLE runifold_schedules ADD COLUMN origin TEXT NOT NULL DEFAULT 'declared';
ALTER TABLE runifold_schedules ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';

-- A detached child (ctx.start_child(..., detached=True)) is not cancelled with its parent.
ALTER TABLE runifold_tasks ADD COLUMN detached INTEGER NOT NULL DEFAULT 0;

-- Streams (ctx.write_stream, store.read_stream): values appended in order per task and
-- key. position is the reader's offset (1, 2, ...); (run, writer, seq) is the write's
-- place in the run that made it (writer '' for the main function, else the step's call
-- id; seq counts that writer's writes to the key), so a write made again by a replay or
-- a step's re-run is not appended twice.
CREATE TABLE runifold_task_streams (
    task_id TEXT NOT NULL,
    key TEXT NOT NULL,
    position INTEGER NOT NULL,
    run INTEGER NOT NULL,
    writer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    value TEXT NOT NULL,
    written_at INTEGER NOT NULL,
    PRIMARY KEY (task_id, key, position),
    UNIQUE (task_id, key, run, writer, seq)
);
