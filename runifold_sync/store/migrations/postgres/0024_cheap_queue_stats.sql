-- Version 24: queue_stats reads only unfinished work, so it stays flat however many
-- finished tasks are kept. Finished tasks are counted as they finish, per tenant, state
-- ('terminal' or 'cancelled') and outcome ('' for none), by triggers on every way a task
-- enters or leaves those states (its end, an operator's requeue, prune's delete), so no
-- write path can forget to count. A count is written to its session's own rows (shard: the
-- backend's pid), so no two transactions ever wait for each other's counter row: shards
-- by a hash of the task id made a batch of completions lock rows in task order, and two
-- batches in the opposite orders deadlocked (claim batch 10 on 4 workers ran at 0.03x).
-- queue_stats sums the shards, and folds those of sessions that have ended into shard 0.
CREATE TABLE runifold_finished_counts (
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    outcome TEXT NOT NULL,
    shard INTEGER NOT NULL,
    count BIGINT NOT NULL,
    PRIMARY KEY (tenant, state, outcome, shard)
) WITH (fillfactor = 50);  -- room on each page for the counters' HOT updates

CREATE FUNCTION runifold_count_finished() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    slot INTEGER := pg_backend_pid();
BEGIN
    IF OLD.state IN ('terminal', 'cancelled') THEN
        INSERT INTO runifold_finished_counts AS c (tenant, state, outcome, shard, count)
        VALUES (OLD.tenant, OLD.state, COALESCE(OLD.outcome, ''), slot, -1)
        ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = c.count - 1;
    END IF;
    IF NEW.state IN ('terminal', 'cancelled') THEN
        INSERT INTO runifold_finished_counts AS c (tenant, state, outcome, shard, count)
        VALUES (NEW.tenant, NEW.state, COALESCE(NEW.outcome, ''), slot, 1)
        ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = c.count + 1;
    END IF;
    RETURN NULL;
END
$$;

-- The WHEN clauses are evaluated without calling the function: a claim, a checkpoint
-- commit or a heartbeat (no finished state before or after) costs a comparison.
CREATE TRIGGER runifold_tasks_finished_count AFTER UPDATE OF state, outcome, tenant ON runifold_tasks
FOR EACH ROW WHEN (
    (OLD.state IN ('terminal', 'cancelled') OR NEW.state IN ('terminal', 'cancelled'))
    AND (OLD.state, OLD.outcome, OLD.tenant) IS DISTINCT FROM (NEW.state, NEW.outcome, NEW.tenant)
)
EXECUTE FUNCTION runifold_count_finished();

-- Tasks are enqueued unfinished; rows written finished (a restore, a bulk load) are
-- counted by statement, from the inserted rows the tenant trigger has captured already.
CREATE FUNCTION runifold_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runifold_finished_counts AS c (tenant, state, outcome, shard, count)
    SELECT tenant, state, COALESCE(outcome, ''), pg_backend_pid(), COUNT(*)
    FROM inserted WHERE state IN ('terminal', 'cancelled')
    GROUP BY tenant, state, COALESCE(outcome, '')
    ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = c.count + EXCLUDED.count;
    RETURN NULL;
END
$$;

CREATE TRIGGER runifold_tasks_finished_inserted AFTER INSERT ON runifold_tasks
REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION runifold_count_inserted();

-- prune deletes finished tasks by the thousand: one grouped write a statement.
CREATE FUNCTION runifold_uncount_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runifold_finished_counts AS c (tenant, state, outcome, shard, count)
    SELECT tenant, state, COALESCE(outcome, ''), pg_backend_pid(), -COUNT(*)
    FROM deleted WHERE state IN ('terminal', 'cancelled')
    GROUP BY tenant, state, COALESCE(outcome, '')
    ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = c.count + EXCLUDED.count;
    RETURN NULL;
END
$$;

CREATE TRIGGER runifold_tasks_finished_deleted AFTER DELETE ON runifold_tasks
REFERENCING OLD TABLE AS deleted FOR EACH STATEMENT EXECUTE FUNCTION runifold_uncount_deleted();

CREATE FUNCTION runifold_uncount_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM runifold_finished_counts;
    RETURN NULL;
END
$$;

CREATE TRIGGER runifold_tasks_finished_truncated AFTER TRUNCATE ON runifold_tasks
FOR EACH STATEMENT EXECUTE FUNCTION runifold_uncount_truncated();

-- The tasks kept so far, counted once; the triggers (created first, so their lock keeps
-- writers out until this commits) count from here on.
INSERT INTO runifold_finished_counts (tenant, state, outcome, shard, count)
SELECT tenant, state, COALESCE(outcome, ''), 0, COUNT(*) FROM runifold_tasks
WHERE state IN ('terminal', 'cancelled')
GROUP BY tenant, state, COALESCE(outcome, '');
