-- Version 24: queue_stats reads only unfinished work, so it stays flat however many
-- finished tasks are kept. Finished tasks are counted as they finish, per tenant, state
-- ('terminal' or 'cancelled') and outcome ('' for none), by triggers on every way a task
-- enters or leaves those states (its end, an operator's requeue, prune's delete), so no
-- write path can forget to count. One writer at a time: one shard (0).
CREATE TABLE runifold_finished_counts (
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    outcome TEXT NOT NULL,
    shard INTEGER NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (tenant, state, outcome, shard)
);

CREATE TRIGGER runifold_tasks_finished_count AFTER UPDATE OF state, outcome, tenant ON runifold_tasks
WHEN (OLD.state IN ('terminal', 'cancelled') OR NEW.state IN ('terminal', 'cancelled'))
    AND (OLD.state IS NOT NEW.state OR OLD.outcome IS NOT NEW.outcome OR OLD.tenant IS NOT NEW.tenant)
BEGIN
    INSERT INTO runifold_finished_counts (tenant, state, outcome, shard, count)
    SELECT OLD.tenant, OLD.state, COALESCE(OLD.outcome, ''), 0, -1
    WHERE OLD.state IN ('terminal', 'cancelled')
    ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = count - 1;
    INSERT INTO runifold_finished_counts (tenant, state, outcome, shard, count)
    SELECT NEW.tenant, NEW.state, COALESCE(NEW.outcome, ''), 0, 1
    WHERE NEW.state IN ('terminal', 'cancelled')
    ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = count + 1;
END;

CREATE TRIGGER runifold_tasks_finished_inserted AFTER INSERT ON runifold_tasks
WHEN NEW.state IN ('terminal', 'cancelled')
BEGIN
    INSERT INTO runifold_finished_counts (tenant, state, outcome, shard, count)
    VALUES (NEW.tenant, NEW.state, COALESCE(NEW.outcome, ''), 0, 1)
    ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = count + 1;
END;

CREATE TRIGGER runifold_tasks_finished_deleted AFTER DELETE ON runifold_tasks
WHEN OLD.state IN ('terminal', 'cancelled')
BEGIN
    INSERT INTO runifold_finished_counts (tenant, state, outcome, shard, count)
    VALUES (OLD.tenant, OLD.state, COALESCE(OLD.outcome, ''), 0, -1)
    ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = count - 1;
END;

-- The tasks kept so far, counted once.
INSERT INTO runifold_finished_counts (tenant, state, outcome, shard, count)
SELECT tenant, state, COALESCE(outcome, ''), 0, COUNT(*) FROM runifold_tasks
WHERE state IN ('terminal', 'cancelled')
GROUP BY tenant, state, COALESCE(outcome, '');
