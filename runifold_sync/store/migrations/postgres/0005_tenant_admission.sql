-- Tenant admission and fair claiming. One row per tenant that has had a task (a trigger
-- adds it, whatever inserts the task). max_leased caps the tenant's unexpired leases;
-- budget_cost caps what its tasks charge (ctx.charge) within a sliding budget_window;
-- served_at, the store time of its last claim, lets a claim serve the least recently
-- served tenant first, so a hot tenant's backlog cannot starve the rest.
CREATE TABLE runifold_tenants (
    tenant TEXT PRIMARY KEY,
    max_leased INTEGER CHECK (max_leased >= 0),
    budget_cost DOUBLE PRECISION CHECK (budget_cost >= 0),
    budget_window INTERVAL CHECK (budget_window > INTERVAL '0'),
    served_at TIMESTAMPTZ,
    CHECK ((budget_cost IS NULL) = (budget_window IS NULL))
);

INSERT INTO runifold_tenants (tenant) SELECT DISTINCT tenant FROM runifold_tasks;

CREATE FUNCTION runifold_add_tenants() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO runifold_tenants (tenant) SELECT DISTINCT tenant FROM inserted
    ON CONFLICT (tenant) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER runifold_tasks_tenant AFTER INSERT ON runifold_tasks
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION runifold_add_tenants();

-- What a budgeted tenant's tasks charged, and when: the growth of usage.cost in a
-- checkpoint, recorded by the write that committed it. Rows older than the window go.
CREATE TABLE runifold_tenant_charges (
    tenant TEXT NOT NULL,
    at TIMESTAMPTZ NOT NULL,
    cost DOUBLE PRECISION NOT NULL
);

CREATE INDEX runifold_tenant_charges_window ON runifold_tenant_charges (tenant, at);

CREATE FUNCTION runifold_checkpoint_cost(checkpoint JSONB) RETURNS DOUBLE PRECISION
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN jsonb_typeof(checkpoint -> 'usage' -> 'cost') = 'number'
        THEN (checkpoint -> 'usage' ->> 'cost')::double precision ELSE 0 END
$$;

CREATE FUNCTION runifold_charge_tenant() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    grown DOUBLE PRECISION := runifold_checkpoint_cost(NEW.checkpoint)
        - COALESCE(runifold_checkpoint_cost(OLD.checkpoint), 0);
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

-- Fires only when usage.cost changed, so commits of tasks that charge nothing skip it.
CREATE TRIGGER runifold_tasks_charge AFTER UPDATE OF checkpoint ON runifold_tasks FOR EACH ROW
    WHEN ((NEW.checkpoint -> 'usage' -> 'cost') IS DISTINCT FROM (OLD.checkpoint -> 'usage' -> 'cost'))
    EXECUTE FUNCTION runifold_charge_tenant();

-- Claims walk tenants and take each one's first ready tasks from this index; the old
-- global claim order is gone. Counting a tenant's leases reads the second.
DROP INDEX runifold_tasks_claimable;

CREATE INDEX runifold_tasks_claimable ON runifold_tasks (tenant, priority DESC, ready_at)
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;

CREATE INDEX runifold_tasks_leased ON runifold_tasks (tenant, lease_expires) WHERE state = 'leased';
