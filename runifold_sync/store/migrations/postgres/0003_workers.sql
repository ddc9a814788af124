-- Worker registry: every worker records who it is and which definition versions it
-- serves, and keeps last_seen fresh, so a deploy can see which referenced versions no
-- live worker serves before it removes one.
CREATE TABLE runifold_workers (
    worker_id TEXT PRIMARY KEY,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    started_at TIMESTAMPTZ NOT NULL,
    last_seen TIMESTAMPTZ NOT NULL,
    stopped_at TIMESTAMPTZ,
    definitions JSONB NOT NULL
);
