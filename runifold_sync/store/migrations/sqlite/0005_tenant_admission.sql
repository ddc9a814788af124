-- Tenant admission and fair claiming. One row per tenant that has had a task (a trigger
-- adds it, whatever inserts the task). max_leased caps the tenant's unexpired leases;
-- budget_cost caps what its tasks charge (ctx.charge) within a sliding window of
-- budget_window_us; served_at, the store time of its last claim, lets a claim serve the
-- least recently served tenant first, so a hot tenant's backlog cannot starve the rest.
CREATE TABLE runifold_tenants (
    tenant TEXT PRIMARY KEY,
    max_leased INTEGER CHECK (max_leased IS NULL OR max_leased >= 0),
    budget_cost REAL CHECK (budget_cost IS NULL OR budget_cost >= 0),
    budget_window_us INTEGER CHECK (budget_window_us IS NULL OR budget_window_us > 0),
    served_at INTEGER,
    CHECK ((budget_cost IS NULL) = (budget_window_us IS NULL))
);

INSERT INTO runifold_tenants (tenant) SELECT DISTINCT tenant FROM runifold_tasks;

CREATE TRIGGER runifold_tasks_tenant AFTER INSERT ON runifold_tasks
BEGIN
    INSERT OR IGNORE INTO runifold_tenants (tenant) VALUES (NEW.tenant);
END;

-- What a budgeted tenant's tasks charged, and when: the growth of usage.cost in a
-- checkpoint, recorded by the write that committed it. Rows older than the window go.
CREATE TABLE runifold_tenant_charges (
    tenant TEXT NOT NULL,
    at INTEGER NOT NULL,
    cost REAL NOT NULL
);

CREATE INDEX runifold_tenant_charges_window ON runifold_tenant_charges (tenant, at);

CREATE TRIGGER runifold_tasks_charge AFTER UPDATE OF checkpoint ON runifold_tasks
WHEN EXISTS (SELECT 1 FROM runifold_tenants WHERE tenant = NEW.tenant AND budget_cost IS NOT NULL)
BEGIN
    INSERT INTO runifold_tenant_charges (tenant, at, cost)
    SELECT NEW.tenant, NEW.updated_at, grown FROM (
        SELECT
            COALESCE(CASE WHEN json_valid(NEW.checkpoint) THEN
                CASE WHEN json_type(NEW.checkpoint, '$.usage.cost') IN ('integer', 'real')
                THEN json_extract(NEW.checkpoint, '$.usage.cost') END END, 0)
            - COALESCE(CASE WHEN json_valid(OLD.checkpoint) THEN
                CASE WHEN json_type(OLD.checkpoint, '$.usage.cost') IN ('integer', 'real')
                THEN json_extract(OLD.checkpoint, '$.usage.cost') END END, 0) AS grown
    )
    WHERE grown > 0;
    DELETE FROM runifold_tenant_charges
    WHERE tenant = NEW.tenant
        AND at <= NEW.updated_at - (SELECT budget_window_us FROM runifold_tenants WHERE tenant = NEW.tenant);
END;

-- Claims walk tenants and take each one's first ready tasks from this index; the old
-- global claim order is gone. Counting a tenant's leases reads the second.
DROP INDEX runifold_tasks_claimable;

CREATE INDEX runifold_tasks_claimable ON runifold_tasks (tenant, priority DESC, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;

CREATE INDEX runifold_tasks_leased ON runifold_tasks (tenant, lease_expires) WHERE state = 'leased';
