-- Version 9: what send_signal can check before it keeps a signal (store/signal_checks.py).
-- The signal names each definition version declares, one row per fingerprint: written
-- when a task is enqueued through a registry (WorkflowRegistry.task) and when a worker
-- serving the version starts. A version with no row is unknown to the store, and its
-- signals are kept unvalidated for the wait to judge, as before.
CREATE TABLE runifold_definitions (
    definition_name TEXT NOT NULL,
    definition_version INTEGER NOT NULL,
    fingerprint TEXT NOT NULL,
    signals TEXT NOT NULL,
    declared_at INTEGER NOT NULL,
    PRIMARY KEY (definition_name, definition_version, fingerprint)
);

-- Who may decide the approval a waiting task waits for, with the fencing token of the
-- suspend that began that wait ({"approvers": [...], "fencing_token": n}); NULL for any
-- other wait. Read only while the task waits for that signal under that token, so a rule
-- an earlier wait left behind is never applied, whatever wrote the current wait.
ALTER TABLE runifold_tasks ADD COLUMN waiting_approval TEXT;
