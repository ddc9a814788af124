-- Named queries for the PostgreSQL store. {now} is store time: clock_timestamp() (not
-- now(), which is frozen at transaction start) plus the shared test offset. A statement
-- that needs the time more than once reads it once through a "clock" CTE, and returns it
-- as "at" so the history event of a transition carries the same instant.
-- Every write under a lease checks task id, fencing token, state and expiry in its
-- WHERE clause; checkpoint writes also check the revision they extend. JSONB columns
-- are read back as text (::text) so JSON null stays distinct from SQL NULL.

-- name: now
SELECT {now} AS now;

-- name: insert_task
WITH clock AS (SELECT {now} AS now)
INSERT INTO runifold_tasks (
    task_id, definition_name, definition_version, tenant, input, input_text, priority, state,
    ready_at, created_at, updated_at, parent_id, trace_context, queue, detached,
    concurrency_key, dedup_key, debounce_key, debounce_until
)
SELECT
    %(task_id)s, %(definition_name)s, %(definition_version)s, %(tenant)s, %(input)s::text::jsonb,
    %(input)s::text, %(priority)s, 'queued',
    GREATEST(clock.now + make_interval(secs => COALESCE(%(debounce)s::float8, 0)),
        COALESCE(%(not_before)s::timestamptz, clock.now)), clock.now, clock.now,
    %(parent_id)s::text, %(trace_context)s::text, %(queue)s, %(detached)s::boolean,
    %(concurrency_key)s::text, %(dedup_key)s::text, %(debounce_key)s::text,
    clock.now + make_interval(secs => %(debounce_max)s::float8)
FROM clock
ON CONFLICT (task_id) DO NOTHING
RETURNING created_at AS at;

-- name: insert_tasks_bulk
-- enqueue_many's tasks without flow options, and their enqueued events, in one statement:
-- one round trip for the batch (the per-task insert_task and insert_event took two a
-- task). %(tasks)s is a JSON array of one object a task, in the batch's order, each with
-- its event's detail: one text parameter, which the client encodes in C rather than
-- escaping each value of an array (three times the client CPU). A task whose id is
-- stored already is not returned (the caller answers for it one by one).
WITH clock AS (SELECT {now} AS now),
given AS (
    SELECT * FROM ROWS FROM (json_to_recordset(%(tasks)s::json) AS (task_id text,
        definition_name text, definition_version bigint, tenant text, input text,
        priority bigint, not_before timestamptz, parent_id text, queue text, detached boolean,
        concurrency_key text, detail jsonb)) WITH ORDINALITY AS g (task_id, definition_name,
        definition_version, tenant, input, priority, not_before, parent_id, queue, detached,
        concurrency_key, detail, n)
),
inserted AS (
    INSERT INTO runifold_tasks (
        task_id, definition_name, definition_version, tenant, input, input_text, priority,
        state, ready_at, created_at, updated_at, parent_id, trace_context, queue, detached,
        concurrency_key
    )
    SELECT g.task_id, g.definition_name, g.definition_version, g.tenant, g.input::jsonb,
        g.input, g.priority, 'queued', GREATEST(g.at, COALESCE(g.not_before, g.at)),
        g.at, g.at, g.parent_id, %(trace_context)s::text, g.queue, g.detached,
        g.concurrency_key
    FROM (
        -- A microsecond apart, in the batch's order and none after now: the claim serves
        -- tasks of one priority by their ready time, so a batch keeps its order as tasks
        -- enqueued one by one do (one stamp for all made the order arbitrary).
        SELECT given.*, clock.now - make_interval(secs => ((SELECT COUNT(*) FROM given) - given.n) / 1e6)
            AS at
        FROM given CROSS JOIN clock
    ) g
    ORDER BY g.n
    ON CONFLICT (task_id) DO NOTHING
    RETURNING task_id, created_at
),
events AS (
    INSERT INTO runifold_events (task_id, at, kind, detail)
    SELECT i.task_id, i.created_at, 'enqueued', g.detail
    FROM inserted i JOIN given g USING (task_id)
    ORDER BY g.n
)
SELECT task_id, created_at AS at FROM inserted;

-- name: task_columns
-- A task row as TaskRecord reads it (row_records.task): the JSON columns as text.
task_id, definition_name, definition_version, tenant, input_text AS input, priority,
    state, outcome, reason, ambiguous_effect, ready_at, worker_id, fencing_token,
    lease_expires, claims_since_progress, revision, head::text AS head,
    result::text AS result, created_at, updated_at, parent_id, waiting_for_child, paused,
    queue, fingerprint, refused_signals, detached, concurrency_key, dedup_key, debounce_key

-- name: select_task
SELECT {query:task_columns}
FROM runifold_tasks WHERE task_id = %(task_id)s;

-- name: select_tasks
SELECT {query:task_columns}
FROM runifold_tasks WHERE task_id = ANY(%(ids)s::text[]);

-- name: lock_limited_tenants
-- First statement of a claim: tenants with a lease limit are locked, so claimers admit
-- their tasks one at a time, and the claim statement that follows (a new snapshot under
-- READ COMMITTED) counts every lease committed before it. Unlimited tenants are not locked.
-- The same statement sets plan_cache_mode for the rest of the transaction (the claim's
-- generic plan, see claim_in), one round of the pipeline fewer than a SET LOCAL, and turns
-- JIT off for it: the claim with its flow-control parts is estimated above
-- jit_above_cost, and compiling it took about 200 ms a claim where the connection's own
-- `SET jit = off` does not reach (behind PgBouncer's transaction pooling).
SELECT set_config('plan_cache_mode', 'force_generic_plan', true) AS plan_cache_mode,
    set_config('jit', 'off', true) AS jit,
    ARRAY(SELECT tenant FROM runifold_tenants WHERE max_leased IS NOT NULL ORDER BY tenant FOR UPDATE)
    AS locked,
    -- Flow limits likewise (sql_flow.py): while any exists, claimers take turns, and each
    -- counts the leases and rated claims of the ones before it.
    ARRAY(SELECT scope || ':' || target FROM runifold_flow_limits ORDER BY scope, target FOR UPDATE)
    AS flow_locked;

-- name: claim_admitted_tenants
-- Part of claim_tasks and claim_routed_tasks (each includes it by name): the tenants a
-- claim may lease for, each with its room under its lease limit and its budget.
tenants AS MATERIALIZED (
    SELECT p.tenant, p.served_at,
        CASE WHEN p.max_leased IS NULL THEN %(limit)s ELSE LEAST(%(limit)s, p.max_leased - (
            SELECT COUNT(*) FROM runifold_tasks l
            WHERE l.tenant = p.tenant AND l.state = 'leased' AND l.lease_expires > clock.now
        )) END AS room
    FROM runifold_tenants p, clock
    WHERE CASE WHEN p.budget_cost IS NULL THEN TRUE ELSE (
        SELECT COALESCE(SUM(ch.cost), 0) FROM runifold_tenant_charges ch
        WHERE ch.tenant = p.tenant AND ch.at > clock.now - p.budget_window
    ) < p.budget_cost END
)

-- name: claim_flow
-- Part of claim_tasks and claim_routed_tasks: flow control by key (sql_flow.py). The
-- limits, the running tasks a definition's or queue's max_running counts, the claims in
-- each rate's window, and the groups closed now (at max_running, or out of rate in their
-- window): no claim reads a closed group's tasks, so a full key never holds back the tasks
-- behind it. A group is closed by either limit alone, so the two are found apart, each only
-- where a limit of its kind is set. A key's running tasks are counted where its tasks are
-- read (claim_flow_open), not for every running task.
limits AS MATERIALIZED (
    SELECT scope, target, max_running, rate_count, rate_period FROM runifold_flow_limits
),
floors AS MATERIALIZED (
    -- Each scope's lowest max_running: a group with fewer running is open to it.
    SELECT scope, MIN(max_running) AS floor FROM limits WHERE max_running IS NOT NULL GROUP BY scope
),
running AS MATERIALIZED (
    -- Tenant by tenant, as each tenant's room counts them (a search of the leased index).
    SELECT l.definition_name, l.queue
    FROM runifold_tenants p, clock, runifold_tasks l
    WHERE l.tenant = p.tenant AND l.state = 'leased' AND l.lease_expires > clock.now
        AND EXISTS (SELECT 1 FROM floors WHERE scope <> 'key')
),
running_groups AS MATERIALIZED (
    SELECT 'definition' AS scope, definition_name AS name, COUNT(*) AS n FROM running
    WHERE EXISTS (SELECT 1 FROM floors WHERE scope = 'definition') GROUP BY definition_name
    UNION ALL SELECT 'queue', queue, COUNT(*) FROM running
    WHERE EXISTS (SELECT 1 FROM floors WHERE scope = 'queue') GROUP BY queue
),
rate_used AS MATERIALIZED (
    -- Each rated group with its claims in its window: every definition or queue with a
    -- rate, and the keys claimed within the longest key rate's period.
    SELECT g.scope, g.name, l.rate_count - {query:flow_window_claims} AS room
    FROM (
        SELECT scope, target AS name FROM limits WHERE scope <> 'key' AND rate_count IS NOT NULL
        UNION SELECT scope, name FROM runifold_flow_claims
        WHERE scope = 'key' AND at > (SELECT now FROM clock) - (
            SELECT MAX(rate_period) FROM limits WHERE scope = 'key' AND rate_count IS NOT NULL)
    ) g, limits l
    WHERE {query:flow_group_limit} AND l.rate_count IS NOT NULL
),
flow_closed AS MATERIALIZED (
    SELECT g.scope, g.name FROM running_groups g JOIN floors f ON f.scope = g.scope, limits l
    WHERE g.n >= f.floor AND {query:flow_group_limit} AND l.max_running <= g.n
    UNION ALL SELECT scope, name FROM rate_used WHERE room <= 0
),

-- name: claim_flow@unflowed
-- With no flow limit set, nothing to count.

-- name: flow_window_claims
-- Part of claim_flow: the claims of group g (g.scope, g.name) in the window of its limit
-- l's rate: its last claim's number less its first one in the window (claims are numbered
-- in order, per group), two index probes however many the window holds.
COALESCE((
    SELECT c.seq FROM runifold_flow_claims c WHERE c.scope = g.scope AND c.name = g.name
    ORDER BY c.at DESC, c.seq DESC LIMIT 1
) - (
    SELECT c.seq FROM runifold_flow_claims c
    WHERE c.scope = g.scope AND c.name = g.name AND c.at > (SELECT now FROM clock) - l.rate_period
    ORDER BY c.at, c.seq LIMIT 1
) + 1, 0)

-- name: flow_group_room
-- Part of claim_flow_candidates: the room of group g (g.scope, g.name, g.n its running
-- tasks) under the limit l that applies to it, u its rate's room (NULL: no claim counted).
LEAST(COALESCE(l.max_running - g.n, %(limit)s), COALESCE(u.room, l.rate_count, %(limit)s))

-- name: flow_group_limit
-- Part of the claims' flow control and of the flow stats: the limit row l of group g. A
-- key's limit is the row naming it, else the longest prefix pattern ("export:*") it
-- matches.
l.scope = g.scope AND l.target = CASE WHEN g.scope <> 'key' THEN g.name ELSE (
        SELECT k.target FROM limits k
        WHERE k.scope = 'key' AND (k.target = g.name OR (right(k.target, 1) = '*'
            AND left(g.name, length(k.target) - 1) = left(k.target, length(k.target) - 1)))
        -- A pattern: by length; a name matched exactly, first.
        ORDER BY CASE WHEN right(k.target, 1) = '*' THEN length(k.target) ELSE 1000000 END DESC LIMIT 1
    ) END

-- name: claim_flow_open
-- Part of the claims' scans of ready tasks (alias t): not in a closed group, and its key
-- (if a key's max_running applies to it) below that limit.
AND (NOT EXISTS (SELECT 1 FROM flow_closed) OR (
    NOT EXISTS (SELECT 1 FROM flow_closed f WHERE f.scope = 'key' AND f.name = t.concurrency_key)
    AND NOT EXISTS (SELECT 1 FROM flow_closed f WHERE f.scope = 'definition' AND f.name = t.definition_name)
    AND NOT EXISTS (SELECT 1 FROM flow_closed f WHERE f.scope = 'queue' AND f.name = t.queue)))
AND (t.concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM floors WHERE scope = 'key')
    OR NOT EXISTS (
        SELECT 1 FROM limits l, (SELECT 'key'::text AS scope, t.concurrency_key AS name) g
        WHERE {query:flow_group_limit} AND l.max_running IS NOT NULL AND l.max_running <= (
            SELECT COUNT(*) FROM runifold_tasks r
            WHERE r.concurrency_key = t.concurrency_key AND r.state = 'leased'
                AND r.lease_expires > (SELECT now FROM clock))))

-- name: claim_flow_open@unflowed
-- With no flow limit set, every group is open.

-- name: claim_lease_chosen
-- Part of claim_tasks and claim_routed_tasks: from the candidates (expired leases and
-- ready tasks), the turns, the tenants marked served, the leases (a routed claim gives a
-- task without a head its route's fingerprint; a task checkpointed under a route-less
-- claim gets its head's) and their history events. An expired lease goes before new
-- work of the same priority: its worker vanished, and it has waited a lease already.
pool AS (SELECT * FROM expired UNION ALL SELECT * FROM ready),
{query:claim_flow_candidates}
chosen AS MATERIALIZED (
    SELECT * FROM (
        SELECT *, ROW_NUMBER() OVER (
            PARTITION BY tenant ORDER BY priority DESC, state = 'leased' DESC, key_turn, ready_at
        ) AS turn
        FROM candidates
    ) ranked
    WHERE turn <= room
    ORDER BY turn, served_at NULLS FIRST, priority DESC, state = 'leased' DESC, ready_at
    LIMIT %(limit)s
),
served AS (
    -- Best effort: a tenant row another claimer is updating right now is being marked
    -- served by it, at nearly the same instant, so it is skipped rather than waited for.
    UPDATE runifold_tenants p SET served_at = (SELECT now FROM clock)
    WHERE p.tenant IN (
        SELECT tenant FROM runifold_tenants
        WHERE tenant IN (SELECT tenant FROM chosen)
        FOR UPDATE SKIP LOCKED
    )
),
leased AS (
    UPDATE runifold_tasks AS t
    SET state = 'leased', worker_id = %(worker_id)s, fencing_token = t.fencing_token + 1,
        lease_expires = clock.now + make_interval(secs => %(lease)s),
        ready_at = clock.now + make_interval(secs => %(lease)s),
        claims_since_progress = t.claims_since_progress + 1, reason = NULL,
        waiting_for_signal = NULL, waiting_for_child = NULL, updated_at = clock.now,
        fingerprint = CASE WHEN t.head IS NULL THEN COALESCE(c.route_fingerprint, t.fingerprint)
            WHEN t.fingerprint IS NULL THEN t.head -> 'definition' ->> 'fingerprint' ELSE t.fingerprint END
    FROM chosen AS c, clock
    WHERE t.task_id = c.task_id
    RETURNING t.task_id, t.tenant, t.definition_name, t.definition_version,
        t.input_text AS input, t.revision, t.head::text AS head, t.fencing_token,
        t.lease_expires, t.claims_since_progress, t.cancel_requested, c.turn, c.served_at,
        t.priority, c.ready_at AS due_at, t.trace_context,
        c.state AS from_state, c.worker_id AS previous_worker, clock.now AS at,
        c.updated_at AS previous_updated_at, c.waiting_for_signal AS previous_signal,
        EXISTS (SELECT 1 FROM runifold_effect_resolutions r WHERE r.task_id = t.task_id) AS resolved
),
{query:claim_flow_counted}
-- Each claim's history event, in the same statement (detail as rows.claimed_detail).
claimed_events AS (
    INSERT INTO runifold_events (task_id, at, kind, worker_id, fencing_token, detail)
    SELECT task_id, at, 'claimed', %(worker_id)s, fencing_token,
        jsonb_build_object('from_state', from_state)
            || CASE WHEN from_state = 'leased'
                THEN jsonb_build_object('expired_owner', previous_worker) ELSE '{}'::jsonb END
    FROM leased
)
SELECT * FROM leased

-- name: claim_flow_candidates
-- Part of claim_lease_chosen: the candidates within the room of their flow-control groups:
-- each group's candidates ranked, and those past its room dropped. Within a tenant each
-- key's first task goes before any key's second.
pool_groups AS MATERIALIZED (
    SELECT g.scope, g.name, {query:flow_group_room} AS room, l.rate_count IS NOT NULL AS rated
    FROM (
        SELECT p.scope, p.name, CASE WHEN p.scope <> 'key' THEN COALESCE(r.n, 0) ELSE (
                SELECT COUNT(*) FROM runifold_tasks t
                WHERE t.concurrency_key = p.name AND t.state = 'leased' AND t.lease_expires > (SELECT now FROM clock)
            ) END AS n
        FROM (
            SELECT 'key' AS scope, concurrency_key AS name FROM pool WHERE concurrency_key IS NOT NULL
            UNION SELECT 'definition', definition_name FROM pool
            UNION SELECT 'queue', queue FROM pool
        ) p LEFT JOIN running_groups r ON r.scope = p.scope AND r.name = p.name
    ) g
    JOIN limits l ON {query:flow_group_limit}
    LEFT JOIN rate_used u ON u.scope = g.scope AND u.name = g.name
),
flowed AS (
    SELECT p.*, kg.room AS key_room, dg.room AS definition_room, qg.room AS queue_room,
        COALESCE(kg.rated, FALSE) AS key_rated, COALESCE(dg.rated, FALSE) AS definition_rated,
        COALESCE(qg.rated, FALSE) AS queue_rated,
        ROW_NUMBER() OVER (
            PARTITION BY p.concurrency_key ORDER BY p.priority DESC, p.state = 'leased' DESC, p.ready_at
        ) AS key_turn,
        ROW_NUMBER() OVER (
            PARTITION BY p.definition_name ORDER BY p.priority DESC, p.state = 'leased' DESC, p.ready_at
        ) AS definition_turn,
        ROW_NUMBER() OVER (
            PARTITION BY p.queue ORDER BY p.priority DESC, p.state = 'leased' DESC, p.ready_at
        ) AS queue_turn
    FROM pool p
    LEFT JOIN pool_groups kg ON kg.scope = 'key' AND kg.name = p.concurrency_key
    LEFT JOIN pool_groups dg ON dg.scope = 'definition' AND dg.name = p.definition_name
    LEFT JOIN pool_groups qg ON qg.scope = 'queue' AND qg.name = p.queue
),
candidates AS (
    SELECT * FROM flowed
    WHERE (key_room IS NULL OR key_turn <= key_room)
        AND (definition_room IS NULL OR definition_turn <= definition_room)
        AND (queue_room IS NULL OR queue_turn <= queue_room)
),

-- name: claim_flow_candidates@unflowed
-- With no flow limit set, every candidate, each key's first task still before its second.
candidates AS (
    SELECT p.*, FALSE AS key_rated, FALSE AS definition_rated, FALSE AS queue_rated,
        ROW_NUMBER() OVER (
            PARTITION BY p.concurrency_key ORDER BY p.priority DESC, p.state = 'leased' DESC, p.ready_at
        ) AS key_turn
    FROM pool p
),

-- name: claim_flow_counted
-- Part of claim_lease_chosen: the claims a rate limit counts, and those older than every
-- rate's period dropped.
flow_claimed AS (
    -- Numbered on from the group's last claim, and never stamped before it (a store clock
    -- set back), so the numbers keep the claims' order (flow_window_claims).
    INSERT INTO runifold_flow_claims (scope, name, at, seq)
    SELECT r.scope, r.name, GREATEST(clock.now, last.at), COALESCE(last.seq, 0) + r.n
    FROM (
        SELECT scope, name, ROW_NUMBER() OVER (PARTITION BY scope, name) AS n FROM (
            SELECT 'key' AS scope, concurrency_key AS name FROM chosen WHERE key_rated
            UNION ALL SELECT 'definition', definition_name FROM chosen WHERE definition_rated
            UNION ALL SELECT 'queue', queue FROM chosen WHERE queue_rated
        ) each
    ) r CROSS JOIN clock
    LEFT JOIN LATERAL (
        SELECT c.at, c.seq FROM runifold_flow_claims c WHERE c.scope = r.scope AND c.name = r.name
        ORDER BY c.at DESC, c.seq DESC LIMIT 1
    ) last ON TRUE
    RETURNING seq
),
-- Claims older than every rate's period, dropped at a group's every 64th claim rather than
-- at every claim: a delete at every claim walked the rows the ones before had deleted (not
-- yet vacuumed) and halved a rated queue's claims/s. A group keeps at most 64 past its window.
flow_pruned AS (
    DELETE FROM runifold_flow_claims
    WHERE EXISTS (SELECT 1 FROM flow_claimed WHERE mod(seq, 64) = 0)
        AND at <= (SELECT now FROM clock) - (SELECT MAX(rate_period) FROM limits)
),

-- name: claim_flow_counted@unflowed
-- With no flow limit set, no claim to count.

-- name: claim_candidate
-- Part of the claims' candidates: what a claim reads of a task it may lease.
t.task_id, t.tenant, t.state, t.worker_id, t.ready_at, t.priority, t.updated_at, t.waiting_for_signal,
    t.concurrency_key, t.definition_name, t.queue

-- name: claim_tasks
-- One statement: admit tenants (room under their lease limit, charges under their
-- budget), lock each admitted tenant's first ready tasks (skipping rows another claimer
-- holds), and lease up to :limit of them in turns: every tenant's first task before any
-- tenant's second, the least recently served tenant first within a turn. Priority orders
-- tasks within a tenant.
WITH clock AS MATERIALIZED (SELECT {now} AS now),
{query:claim_admitted_tenants},
{query:claim_flow}
expired AS MATERIALIZED (
    SELECT c.*, p.served_at, p.room FROM tenants p CROSS JOIN LATERAL (
        SELECT {query:claim_candidate}, NULL::text AS route_fingerprint
        FROM runifold_tasks t
        WHERE t.tenant = p.tenant AND t.state = 'leased' AND t.lease_expires <= (SELECT now FROM clock)
            AND t.paused IS NULL
            {query:claim_flow_open}
        ORDER BY t.priority DESC, t.lease_expires
        LIMIT GREATEST(p.room, 0)
        FOR UPDATE SKIP LOCKED
    ) c
),
ready AS MATERIALIZED (
    SELECT c.*, p.served_at, p.room FROM tenants p CROSS JOIN LATERAL (
        SELECT {query:claim_candidate}, NULL::text AS route_fingerprint
        FROM runifold_tasks t
        WHERE t.tenant = p.tenant AND t.state IN ('queued', 'waiting')
            AND t.ready_at IS NOT NULL AND t.ready_at <= (SELECT now FROM clock) AND t.paused IS NULL
            {query:claim_flow_open}
        ORDER BY t.priority DESC, t.ready_at
        LIMIT GREATEST(p.room, 0)
        FOR UPDATE SKIP LOCKED
    ) c
),
{query:claim_lease_chosen};

-- name: claim_routed_tasks
-- claim_tasks for a worker's routes (Routes: every (queue, name, version, fingerprint)
-- it serves, as four arrays): each admitted tenant's first ready tasks of each route,
-- read from runifold_tasks_routed in claim order and locked as they are read, and its
-- expired leases of each route, then that tenant's best of them. A task with a head is taken only by the fingerprint it was
-- claimed with (a task checkpointed under a route-less claim: any, and this claim records
-- its head's); a task claimed without a head takes the route's fingerprint, the one its
-- first checkpoint is written by.
WITH clock AS MATERIALIZED (SELECT {now} AS now),
{query:claim_admitted_tenants},
{query:claim_flow}
routes AS MATERIALIZED (
    SELECT * FROM unnest(%(route_queues)s::text[], %(route_names)s::text[],
        %(route_versions)s::int[], %(route_fingerprints)s::text[]) AS r (queue, name, version, fingerprint)
),
-- Expired leases of the routes, read from the partial index of leased tasks (the few whose
-- worker vanished, not the route's backlog).
expired AS MATERIALIZED (
    SELECT c.*, p.served_at, p.room FROM tenants p CROSS JOIN LATERAL (
        SELECT x.* FROM routes r CROSS JOIN LATERAL (
            SELECT {query:claim_candidate}, r.fingerprint AS route_fingerprint
            FROM runifold_tasks t
            WHERE t.tenant = p.tenant AND t.state = 'leased' AND t.lease_expires <= (SELECT now FROM clock)
                AND t.queue = r.queue AND t.definition_name = r.name AND t.definition_version = r.version
                AND t.paused IS NULL
            {query:claim_flow_open}
                AND (t.head IS NULL OR t.fingerprint IS NULL OR t.fingerprint = r.fingerprint)
            ORDER BY t.priority DESC, t.lease_expires
            LIMIT GREATEST(p.room, 0)
            FOR UPDATE SKIP LOCKED
        ) x
        ORDER BY x.priority DESC, x.ready_at
        LIMIT GREATEST(p.room, 0)
    ) c
),
ready AS MATERIALIZED (
    SELECT c.*, p.served_at, p.room FROM tenants p CROSS JOIN LATERAL (
        SELECT x.* FROM routes r CROSS JOIN LATERAL (
            SELECT {query:claim_candidate}, r.fingerprint AS route_fingerprint
            FROM runifold_tasks t
            WHERE t.tenant = p.tenant AND t.queue = r.queue AND t.definition_name = r.name
                AND t.definition_version = r.version AND t.state IN ('queued', 'waiting')
                AND t.ready_at IS NOT NULL AND t.ready_at <= (SELECT now FROM clock) AND t.paused IS NULL
            {query:claim_flow_open}
                AND (t.head IS NULL OR t.fingerprint IS NULL OR t.fingerprint = r.fingerprint)
            ORDER BY t.priority DESC, t.ready_at
            LIMIT GREATEST(p.room, 0)
            FOR UPDATE SKIP LOCKED
        ) x
        ORDER BY x.priority DESC, x.ready_at
        LIMIT GREATEST(p.room, 0)
    ) c
),
{query:claim_lease_chosen};

-- name: write_applied
-- A fenced write whose answer was lost with its connection, refused when sent again:
-- the row as that write left it, if it did apply (its token, the revision after it; only
-- the lease holder writes under its token, one write at a time).
SELECT revision, state, cancel_requested, paused, ready_at FROM runifold_tasks
WHERE task_id = %(task_id)s AND fencing_token = %(token)s AND revision = %(revision)s;

-- name: forgive_lost_claim
-- A claim whose worker lived through losing its lease (cut off from the store) no longer
-- counts toward a crash loop: taken back from claims_since_progress while no progress was
-- committed since it was made (the revision it saw) nor the lease ended by its holder (a
-- release took its own claim back already), and once only (its lease_lost event, which a
-- statement after lock_task sees whoever wrote it).
UPDATE runifold_tasks AS t SET claims_since_progress = t.claims_since_progress - 1
WHERE t.task_id = %(task_id)s AND t.revision = %(revision)s
    AND (t.fencing_token > %(token)s OR (t.fencing_token = %(token)s AND t.state = 'leased'))
    AND t.claims_since_progress > 0 AND t.state IN ('queued', 'waiting', 'leased')
    AND NOT EXISTS (
        SELECT 1 FROM runifold_events e
        WHERE e.task_id = t.task_id AND e.kind = 'lease_lost' AND e.fencing_token = %(token)s
    )
RETURNING t.task_id;

-- name: resolutions_for_task
SELECT effect_key, applied, result::text AS result, actor, reason
FROM runifold_effect_resolutions WHERE task_id = %(task_id)s;

-- name: heartbeat
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET lease_expires = clock.now + make_interval(secs => %(lease)s),
    ready_at = clock.now + make_interval(secs => %(lease)s)
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now
RETURNING t.lease_expires, t.cancel_requested, t.paused;

-- name: commit_checkpoint
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET head = %(head)s::jsonb, revision = t.revision + 1, claims_since_progress = 0,
    updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now AND t.revision = %(revision)s
RETURNING t.revision, t.cancel_requested, t.paused;

-- name: suspend
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'waiting', head = %(head)s::jsonb, revision = t.revision + 1,
    claims_since_progress = 0, lease_expires = NULL, reason = COALESCE(t.paused, %(reason)s),
    updated_at = clock.now,
    waiting_for_signal = %(signal)s::text, waiting_approval = %(approval)s::jsonb,
    waiting_for_child = %(child)s::text,
    -- A signal that arrived while the worker was deciding to wait wakes the task now.
    ready_at = CASE WHEN EXISTS (
        SELECT 1 FROM runifold_signals s
        WHERE s.task_id = t.task_id AND s.consumed_at IS NULL
            AND s.name = ANY(string_to_array(%(signal)s::text, E'\n'))
    ) THEN clock.now ELSE %(wake_at)s::timestamptz END
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now AND t.revision = %(revision)s AND t.cancel_requested IS NULL
RETURNING clock.now AS at;

-- name: retry
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'queued', head = %(head)s::jsonb, revision = t.revision + 1,
    claims_since_progress = 0, ready_at = clock.now + make_interval(secs => %(delay)s),
    lease_expires = NULL, reason = %(reason)s, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now AND t.revision = %(revision)s AND t.cancel_requested IS NULL
RETURNING t.ready_at, clock.now AS at;

-- name: release
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'queued', ready_at = clock.now + make_interval(secs => %(delay)s),
    lease_expires = NULL, claims_since_progress = GREATEST(t.claims_since_progress - 1, 0),
    reason = %(reason)s, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now
RETURNING clock.now AS at;

-- name: leases_held_by
-- The unexpired leases a worker holds (read through the partial index of leased tasks).
SELECT task_id, tenant, worker_id, fencing_token, lease_expires, cancel_requested, paused
FROM runifold_tasks
WHERE state = 'leased' AND worker_id = %(worker_id)s AND lease_expires > {now}
ORDER BY task_id;

-- name: hand_back_dead_lease
-- The lease of a worker whose process is gone expires now: claimable at once, as after
-- its lease ran out (the claim still counts as an attempt, and records the expired owner).
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET lease_expires = clock.now, ready_at = clock.now, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.worker_id = %(worker_id)s
    AND t.state = 'leased' AND t.lease_expires > clock.now
RETURNING clock.now AS at;

-- name: complete
-- This and the other transitions that end a task (fail, acknowledge_cancel,
-- cancel_unleased) NOTIFY runifold_results with the task id when a waiter of
-- store.wait_for_task has marked the task awaited (await_result; store/pglisten.py);
-- delivered at commit, so a waiter that wakes reads the finished row.
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'terminal', outcome = 'completed', head = %(head)s::jsonb,
    revision = t.revision + 1, result = %(result)s::jsonb, ready_at = NULL,
    lease_expires = NULL, reason = NULL, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now AND t.revision = %(revision)s AND t.cancel_requested IS NULL
RETURNING clock.now AS at, t.task_id, t.parent_id, CASE WHEN t.result_awaited THEN pg_notify('runifold_results', t.task_id) END AS finished;

-- name: use_generic_plans
-- For the rest of the transaction: complete_batch takes about 2 ms to plan, more than it
-- takes to run, and with plan_cache_mode=auto the server kept planning it anew.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true);

-- name: complete_batch
-- Several tasks' completions (store.complete_batch) in one statement, each written as
-- complete writes it with its history event, journal rows and result NOTIFY. Rows are
-- found by primary key (the = ANY), whatever the statistics say: the state check is
-- written "IS TRUE" so that it cannot match the partial index of leased tasks, which a
-- plan made on statistics from before a backlog was leased read whole for each batch.
-- A parent waiting for a child of the batch is woken as complete's parent_woken CTE
-- does; the parents are locked in id order first, so two batches waking the same
-- parents cannot deadlock, and they too are looked up by primary key (= ANY of an
-- array): joined to the batch, a plan that believed the task table small scanned it
-- whole (tests/store/postgres/test_complete_batch_plan.py).
-- The completions and their journal rows come as two JSON arrays of records (each head,
-- result and entry as JSON text inside them; why not text[]: pgstatements.journal_params).
-- Returns the completed tasks; a task missing from the answer was refused.
WITH clock AS (SELECT {now} AS now),
batch AS (
    SELECT * FROM jsonb_to_recordset(%(completions)s::jsonb)
        AS b (task_id text, token bigint, revision bigint, head text, result text, worker_id text, detail text)
),
fenced AS (
    UPDATE runifold_tasks AS t
    SET state = 'terminal', outcome = 'completed', head = b.head::jsonb,
        revision = t.revision + 1, result = b.result::jsonb, ready_at = NULL,
        lease_expires = NULL, reason = NULL, updated_at = clock.now
    FROM clock, batch AS b
    WHERE t.task_id = ANY(ARRAY(SELECT task_id FROM batch)) AND t.task_id = b.task_id
        AND t.fencing_token = b.token AND (t.state = 'leased') IS TRUE AND t.lease_expires > clock.now
        AND t.revision = b.revision AND t.cancel_requested IS NULL
    RETURNING clock.now AS at, t.task_id, t.parent_id, b.token, b.worker_id, b.detail,
        CASE WHEN t.result_awaited THEN pg_notify('runifold_results', t.task_id) END AS finished
),
event AS (
    INSERT INTO runifold_events (task_id, at, kind, worker_id, fencing_token, detail)
    SELECT task_id, at, 'completed', worker_id, token, detail::jsonb FROM fenced
),
rows AS (
    SELECT * FROM jsonb_to_recordset(%(journal)s::jsonb)
        AS r (task_id text, journal text, position int, entry text)
),
journal_written AS (
    INSERT INTO runifold_journal (task_id, journal, position, entry)
    SELECT r.task_id, r.journal, r.position, r.entry FROM rows AS r JOIN fenced USING (task_id)
    WHERE r.entry IS NOT NULL
    ON CONFLICT (task_id, journal, position) DO UPDATE SET entry = excluded.entry
),
journal_dropped AS (
    DELETE FROM runifold_journal AS j USING rows AS r, fenced AS f
    WHERE r.entry IS NULL AND r.task_id = f.task_id AND j.task_id = r.task_id
        AND j.journal = r.journal AND j.position = r.position
),
children AS (
    SELECT parent_id, array_agg(task_id) AS ids, max(at) AS at FROM fenced
    WHERE parent_id IS NOT NULL GROUP BY parent_id
),
parents AS (
    SELECT p.task_id FROM runifold_tasks AS p
    WHERE p.task_id = ANY(ARRAY(SELECT parent_id FROM children)) ORDER BY p.task_id FOR UPDATE
),
parent_woken AS (
    UPDATE runifold_tasks AS p SET ready_at = CASE
        WHEN p.state = 'waiting' AND string_to_array(p.waiting_for_child, E'\n') && c.ids
            AND (p.ready_at IS NULL OR p.ready_at > c.at) THEN c.at ELSE p.ready_at END
    FROM children AS c JOIN parents AS l ON l.task_id = c.parent_id
    WHERE p.task_id = ANY(ARRAY(SELECT parent_id FROM children)) AND p.task_id = c.parent_id
    RETURNING CASE WHEN p.ready_at = c.at THEN pg_notify('runifold_tasks', txid_current()::text || ':1') END
)
SELECT task_id FROM fenced;

-- name: await_result
-- A waiter, once it listens on runifold_results and before it reads the task again: the
-- transition that ends the task from now on sees the mark and notifies. One that holds
-- the row while this runs commits first, and the waiter's read then finds it ended.
UPDATE runifold_tasks SET result_awaited = true WHERE task_id = %(task_id)s AND NOT result_awaited;

-- name: pending_cancel
-- Why complete, suspend or retry changed no row: the lease still holds and only a cancel
-- request stood in the way (no row: the lease was lost).
SELECT cancel_requested FROM runifold_tasks
WHERE task_id = %(task_id)s AND fencing_token = %(token)s AND state = 'leased'
    AND lease_expires > {now} AND revision = %(revision)s AND cancel_requested IS NOT NULL;

-- name: fail
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'terminal', outcome = 'failed',
    head = COALESCE(%(head)s::jsonb, t.head), revision = t.revision + 1,
    ready_at = NULL, lease_expires = NULL, reason = %(reason)s,
    ambiguous_effect = %(ambiguous_effect)s, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now AND t.revision = %(revision)s
RETURNING clock.now AS at, t.task_id, t.parent_id, CASE WHEN t.result_awaited THEN pg_notify('runifold_results', t.task_id) END AS finished;

-- name: requeue_resolved
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'queued', outcome = NULL, ambiguous_effect = NULL, reason = NULL, cancel_requested = NULL,
    claims_since_progress = 0, ready_at = clock.now, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state = 'terminal' AND t.ambiguous_effect = %(effect_key)s
RETURNING clock.now AS at;

-- name: insert_resolution
INSERT INTO runifold_effect_resolutions
    (task_id, effect_key, applied, result, actor, reason, resolved_at)
VALUES (%(task_id)s, %(effect_key)s, %(applied)s, %(result)s::jsonb, %(actor)s, %(reason)s, %(now)s)
ON CONFLICT (task_id, effect_key) DO UPDATE SET
    applied = excluded.applied, result = excluded.result, actor = excluded.actor,
    reason = excluded.reason, resolved_at = excluded.resolved_at;

-- name: insert_event
INSERT INTO runifold_events (task_id, at, kind, worker_id, fencing_token, detail)
VALUES (%(task_id)s, %(now)s, %(kind)s, %(worker_id)s, %(token)s, %(detail)s::jsonb);

-- name: task_events
SELECT event_id, task_id, at, kind, worker_id, fencing_token, detail
FROM runifold_events WHERE task_id = %(task_id)s ORDER BY event_id;

-- name: set_clock_offset
UPDATE runifold_clock SET offset_s = %(offset)s WHERE id = 1;

-- name: seconds_until_due
SELECT EXTRACT(EPOCH FROM MIN(ready_at) - {now})::float8 AS due_in_s FROM runifold_tasks
WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;

-- name: clock_reading
-- Store now, the shared offset, and the earliest ready_at of a task no worker holds and
-- no operator paused: the next time a claim could find work (the testing kit's skip).
SELECT {now} AS now, (SELECT offset_s FROM runifold_clock WHERE id = 1) AS clock_offset,
    (SELECT MIN(ready_at) FROM runifold_tasks
     WHERE state IN ('queued', 'waiting') AND ready_at IS NOT NULL AND paused IS NULL) AS next_due;

-- name: seconds_until_routed_due
-- seconds_until_due among the tasks a worker's routes can claim: the earliest due time
-- of each route from runifold_tasks_routed_due (a task with another fingerprint's head
-- is passed over), so an idle worker does not wake for work it cannot take.
SELECT EXTRACT(EPOCH FROM MIN(x.ready_at) - {now})::float8 AS due_in_s
FROM unnest(%(route_queues)s::text[], %(route_names)s::text[], %(route_versions)s::int[],
    %(route_fingerprints)s::text[]) AS r (queue, name, version, fingerprint)
CROSS JOIN LATERAL (
    SELECT t.ready_at FROM runifold_tasks t
    WHERE t.queue = r.queue AND t.definition_name = r.name AND t.definition_version = r.version
        AND t.state IN ('queued', 'waiting', 'leased') AND t.ready_at IS NOT NULL
        AND t.definition_version > 0  -- the term that lets this query, and only it, use the index
        AND (t.head IS NULL OR t.fingerprint IS NULL OR t.fingerprint = r.fingerprint)
    ORDER BY t.ready_at
    LIMIT 1
) x;

-- name: notify_work
-- Wakes idle workers at commit; the payload says which transaction announces how many
-- claimable tasks, so about that many of them claim (postgres/wait.py).
SELECT pg_notify('runifold_tasks', txid_current()::text || ':' || %(count)s::int::text);

-- name: take_wake_slot
-- One of a notification's wake slots for this connection's session, the first free one.
SELECT s FROM generate_series(0, %(slots)s::int - 1) AS s
WHERE pg_try_advisory_lock(%(key)s::int, s)
LIMIT 1;

-- name: release_wake_slots
-- The wake slot this connection took at its last wait (the store takes no other session
-- advisory lock).
SELECT pg_advisory_unlock_all();

-- name: listen_work
LISTEN runifold_tasks;

-- name: unlisten_work
UNLISTEN runifold_tasks;

-- name: requeue_failed
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'queued', outcome = NULL, reason = NULL, cancel_requested = NULL, claims_since_progress = 0,
    ready_at = clock.now, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state = 'terminal' AND t.outcome = 'failed'
    AND t.ambiguous_effect IS NULL
RETURNING clock.now AS at;

-- name: list_tasks
SELECT {query:task_columns}
FROM runifold_tasks
WHERE {query:task_page_filters}
ORDER BY created_at, task_id
LIMIT %(limit)s;

-- name: list_children
-- list_tasks given a parent: read from the partial index runifold_tasks_parent, whatever
-- plan the filters' "IS NULL OR" form would get.
SELECT {query:task_columns}
FROM runifold_tasks
WHERE parent_id = %(parent)s::text AND {query:task_page_filters}
ORDER BY created_at, task_id
LIMIT %(limit)s;

-- name: referenced_versions
SELECT definition_name, definition_version,
    COUNT(*) FILTER (WHERE state = 'queued') AS queued,
    COUNT(*) FILTER (WHERE state = 'leased') AS leased,
    COUNT(*) FILTER (WHERE state = 'waiting') AS waiting,
    COUNT(*) FILTER (WHERE state = 'terminal') AS recoverable,
    string_agg(DISTINCT head -> 'definition' ->> 'fingerprint', ',') AS fingerprints
FROM runifold_tasks
WHERE state IN ('queued', 'leased', 'waiting')
    OR (state = 'terminal' AND ambiguous_effect IS NOT NULL)
GROUP BY definition_name, definition_version
ORDER BY definition_name, definition_version;

-- name: queue_stats
-- The unfinished tasks from the partial indexes that hold only them (a due time:
-- runifold_tasks_routed, as the claim reads; none: runifold_tasks_unready), the finished
-- ones from the counters the triggers of migration 24 keep: flat however many finished
-- tasks are kept. The counters of sessions that have ended are folded into shard 0 on the
-- way (by one reader at a time; the sums read are the same before and after), so the
-- counter table stays as small as the sessions that write it.
WITH clock AS (SELECT {now} AS now),
folded AS (
    DELETE FROM runifold_finished_counts c
    WHERE c.shard <> 0 AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = c.shard)
        AND pg_try_advisory_xact_lock(5932734160749284931)  -- 'RUNIFINC'
    RETURNING tenant, state, outcome, count
),
refolded AS (
    INSERT INTO runifold_finished_counts AS c (tenant, state, outcome, shard, count)
    SELECT tenant, state, outcome, 0, SUM(count) FROM folded GROUP BY tenant, state, outcome
    ON CONFLICT (tenant, state, outcome, shard) DO UPDATE SET count = c.count + EXCLUDED.count
),
unfinished AS (
    SELECT tenant, state, outcome, ready_at FROM runifold_tasks
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL
    UNION ALL
    SELECT tenant, state, outcome, ready_at FROM runifold_tasks
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NULL
)
SELECT tenant, state, outcome, COUNT(*) AS count,
    EXTRACT(EPOCH FROM (SELECT now FROM clock)
        - MIN(ready_at) FILTER (WHERE state = 'queued' AND ready_at <= (SELECT now FROM clock)))
        AS oldest_ready_age_s
FROM unfinished
GROUP BY tenant, state, outcome
UNION ALL
SELECT tenant, state, NULLIF(outcome, ''), SUM(count), NULL
FROM runifold_finished_counts
GROUP BY tenant, state, outcome
HAVING SUM(count) <> 0
ORDER BY tenant, state, outcome;

-- name: insert_signal
WITH clock AS (SELECT {now} AS now)
INSERT INTO runifold_signals (task_id, signal_id, name, payload, payload_text, sender, reason, sent_at)
SELECT %(task_id)s, %(signal_id)s, %(name)s, %(payload)s::text::jsonb, %(payload)s::text, %(sender)s,
    %(reason)s, clock.now
FROM clock
ON CONFLICT (task_id, signal_id) DO NOTHING
RETURNING sent_at AS at;

-- name: select_signal
SELECT name, payload_text AS payload FROM runifold_signals
WHERE task_id = %(task_id)s AND signal_id = %(signal_id)s;

-- name: count_refused_signal
UPDATE runifold_tasks SET refused_signals = refused_signals + 1 WHERE task_id = %(task_id)s;

-- name: count_pending_signals
SELECT COUNT(*) AS pending FROM runifold_signals
WHERE task_id = %(task_id)s AND consumed_at IS NULL;

-- name: wake_for_signal
-- Moves only ready_at: updated_at keeps the suspension time, so the claim that resumes
-- the task can tell how long it waited.
UPDATE runifold_tasks SET ready_at = %(now)s
-- waiting_for_signal holds the names a wait takes, one a line.
WHERE task_id = %(task_id)s AND state = 'waiting'
    AND %(name)s::text = ANY(string_to_array(waiting_for_signal, E'\n'));

-- name: pending_signals
SELECT signal_id, name, payload_text AS payload, sender, reason, sent_at FROM runifold_signals
WHERE task_id = %(task_id)s AND name = %(name)s AND consumed_at IS NULL
ORDER BY sent_at, signal_id;

-- name: all_pending_signals
SELECT signal_id, name, payload_text AS payload, sender, reason, sent_at FROM runifold_signals
WHERE task_id = %(task_id)s AND consumed_at IS NULL
ORDER BY sent_at, signal_id;

-- name: consume_signal
UPDATE runifold_signals SET consumed_at = %(now)s
WHERE task_id = %(task_id)s AND signal_id = %(signal_id)s AND consumed_at IS NULL
RETURNING sender;

-- name: cancel_unleased
-- Only a task with nothing to undo: its checkpoint lists no more completed steps with a
-- compensation ("undo") than it has compensated.
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'cancelled', ready_at = NULL, waiting_for_signal = NULL, reason = %(reason)s,
    updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state IN ('queued', 'waiting')
    AND NOT (CASE WHEN jsonb_typeof(t.head -> 'undo') = 'array'
        THEN jsonb_array_length(t.head -> 'undo') ELSE 0 END
    > CASE WHEN jsonb_typeof(t.head -> 'compensated') = 'array'
        THEN jsonb_array_length(t.head -> 'compensated') ELSE 0 END)
RETURNING clock.now AS at, t.parent_id, CASE WHEN t.result_awaited THEN pg_notify('runifold_results', t.task_id) END AS finished;

-- name: cancel_with_undo
-- A queued or waiting task with compensations to run: no step of its main function runs
-- again, but a worker claims it at once, sees cancel_requested, runs them and ends it
-- cancelled.
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'queued', cancel_requested = %(reason)s, ready_at = clock.now, paused = NULL,
    waiting_for_signal = NULL, reason = %(reason)s || '; its compensations run next',
    updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state IN ('queued', 'waiting')
    AND (CASE WHEN jsonb_typeof(t.head -> 'undo') = 'array'
        THEN jsonb_array_length(t.head -> 'undo') ELSE 0 END
    > CASE WHEN jsonb_typeof(t.head -> 'compensated') = 'array'
        THEN jsonb_array_length(t.head -> 'compensated') ELSE 0 END)
RETURNING clock.now AS at;

-- name: request_cancel
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t SET cancel_requested = %(reason)s, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state = 'leased'
RETURNING clock.now AS at;

-- name: acknowledge_cancel
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'cancelled', head = %(head)s::jsonb, revision = t.revision + 1,
    ready_at = NULL, lease_expires = NULL, reason = t.cancel_requested, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now AND t.revision = %(revision)s
RETURNING clock.now AS at, t.reason, t.task_id, t.parent_id, CASE WHEN t.result_awaited THEN pg_notify('runifold_results', t.task_id) END AS finished;

-- name: lock_task
-- Serializes deliveries and cancels of one task: the pending-signal cap counts exactly,
-- and a worker's suspend, retry or yield cannot move the row between a cancel's checks.
SELECT tenant, state, cancel_requested, definition_name, definition_version, fencing_token,
    refused_signals, waiting_for_signal, waiting_approval::text AS waiting_approval
FROM runifold_tasks WHERE task_id = %(task_id)s FOR UPDATE;

-- name: declare_signals
WITH clock AS (SELECT {now} AS now)
INSERT INTO runifold_definitions (definition_name, definition_version, fingerprint, signals, declared_at)
SELECT %(definition_name)s, %(definition_version)s, %(fingerprint)s, %(signals)s::jsonb, clock.now
FROM clock
ON CONFLICT (definition_name, definition_version, fingerprint) DO NOTHING;

-- name: declared_signals
SELECT fingerprint, signals::text AS signals FROM runifold_definitions
WHERE definition_name = %(definition_name)s AND definition_version = %(definition_version)s
ORDER BY fingerprint;

-- name: wake_if_signal_pending
UPDATE runifold_tasks AS t SET ready_at = %(now)s
WHERE t.task_id = %(task_id)s AND t.state = 'waiting' AND t.waiting_for_signal = %(name)s
    AND (t.ready_at IS NULL OR t.ready_at > %(now)s)
    AND EXISTS (
        SELECT 1 FROM runifold_signals s
        WHERE s.task_id = t.task_id AND s.consumed_at IS NULL
            AND s.name = ANY(string_to_array(%(name)s::text, E'\n'))
    );

-- name: register_worker
WITH clock AS (SELECT {now} AS now)
INSERT INTO runifold_workers (worker_id, host, pid, started_at, last_seen, stopped_at, definitions, queues)
SELECT %(worker_id)s, %(host)s, %(pid)s, clock.now, clock.now, NULL, %(definitions)s::jsonb,
    %(queues)s::jsonb FROM clock
ON CONFLICT (worker_id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,
    last_seen = excluded.last_seen, stopped_at = NULL, definitions = excluded.definitions,
    queues = excluded.queues;

-- name: worker_seen
UPDATE runifold_workers SET last_seen = {now} WHERE worker_id = %(worker_id)s AND pid = %(pid)s;

-- name: leases_of_worker
-- The unexpired leases one worker holds: a claim whose answer was lost with its
-- connection leaves some it does not know of (few rows: the leased tasks).
SELECT task_id, tenant, fencing_token, lease_expires, cancel_requested, paused FROM runifold_tasks
WHERE state = 'leased' AND worker_id = %(worker_id)s AND lease_expires > {now};

-- name: worker_stopped
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_workers AS w SET stopped_at = clock.now, last_seen = clock.now FROM clock
WHERE w.worker_id = %(worker_id)s AND w.pid = %(pid)s;

-- name: list_workers
WITH clock AS (SELECT {now} AS now)
SELECT worker_id, host, pid, started_at, last_seen, stopped_at, definitions::text AS definitions,
    queues::text AS queues, EXTRACT(EPOCH FROM clock.now - last_seen) AS silent_s
FROM runifold_workers, clock ORDER BY worker_id;

-- name: set_tenant_policy
INSERT INTO runifold_tenants (tenant, max_leased, budget_cost, budget_window)
VALUES (%(tenant)s, %(max_leased)s, %(budget_cost)s,
    make_interval(secs => %(budget_window)s::double precision))
ON CONFLICT (tenant) DO UPDATE SET max_leased = excluded.max_leased,
    budget_cost = excluded.budget_cost, budget_window = excluded.budget_window;

-- name: tenant_admission
WITH clock AS MATERIALIZED (SELECT {now} AS now)
SELECT p.tenant, p.max_leased, p.budget_cost, EXTRACT(EPOCH FROM p.budget_window) AS budget_window,
    clock.now AS at,
    (SELECT COUNT(*) FROM runifold_tasks l
        WHERE l.tenant = p.tenant AND l.state = 'leased' AND l.lease_expires > clock.now) AS leased,
    (SELECT COALESCE(SUM(ch.cost), 0) FROM runifold_tenant_charges ch
        WHERE ch.tenant = p.tenant AND ch.at > clock.now - p.budget_window) AS spent,
    (SELECT MIN(ch.at) FROM runifold_tenant_charges ch
        WHERE ch.tenant = p.tenant AND ch.at > clock.now - p.budget_window) AS oldest_charge_at,
    (SELECT COUNT(*) FROM runifold_tasks r
        WHERE r.tenant = p.tenant AND r.state IN ('queued', 'waiting')
            AND r.ready_at IS NOT NULL AND r.ready_at <= clock.now) AS ready
FROM runifold_tenants p, clock
WHERE p.max_leased IS NOT NULL OR p.budget_cost IS NOT NULL
ORDER BY p.tenant;

-- name: continue_as_new
-- ctx.continue_as_new: the same task, queued afresh with a new input and the next run's
-- head; its journal rows go in the same transaction (clear_journal).
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'queued', head = %(head)s::jsonb, input = %(input)s::text::jsonb, input_text = %(input)s::text,
    revision = t.revision + 1, claims_since_progress = 0, ready_at = clock.now,
    lease_expires = NULL, reason = NULL, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.fencing_token = %(token)s AND t.state = 'leased'
    AND t.lease_expires > clock.now AND t.revision = %(revision)s AND t.cancel_requested IS NULL
RETURNING clock.now AS at;

-- name: clear_journal
DELETE FROM runifold_journal WHERE task_id = %(task_id)s;

-- name: journal_rows
SELECT journal, position, entry FROM runifold_journal WHERE task_id = %(task_id)s
ORDER BY journal, position;

-- name: journal_tail
-- The newest entries of the main journal, newest first (the caller puts them in order).
SELECT journal, position, entry FROM runifold_journal WHERE task_id = %(task_id)s AND journal = ''
ORDER BY position DESC LIMIT %(limit)s;

-- name: journal_length
SELECT COUNT(*) AS entries FROM runifold_journal WHERE task_id = %(task_id)s AND journal = '';

-- name: wake_parent
-- A child ended: its parent, if it waits for this child, is due now. The row is updated
-- whatever its state (to itself when it does not wait), so this transaction holds the
-- parent's row lock: a suspend for this child that raced it either waits for this commit
-- and then sees the child ended (wake_if_child_finished), or committed first and is
-- woken here (the UPDATE re-reads the row it waited for).
UPDATE runifold_tasks AS p
-- waiting_for_child holds the children a wait takes (ctx.wait_any), one a line.
SET ready_at = CASE WHEN p.state = 'waiting'
    AND %(task_id)s::text = ANY(string_to_array(p.waiting_for_child, E'\n'))
    AND (p.ready_at IS NULL OR p.ready_at > %(now)s) THEN %(now)s ELSE p.ready_at END
WHERE p.task_id = %(parent_id)s::text
RETURNING p.ready_at = %(now)s AS woke;

-- name: wake_if_child_finished
-- After a suspend for a child: a new statement, so it sees a child's end that committed
-- while the suspend waited for the row lock.
UPDATE runifold_tasks AS t SET ready_at = %(now)s
WHERE t.task_id = %(task_id)s AND t.state = 'waiting' AND t.waiting_for_child = %(child)s::text
    AND (t.ready_at IS NULL OR t.ready_at > %(now)s)
    AND EXISTS (
        SELECT 1 FROM runifold_tasks c
        WHERE c.task_id = ANY(string_to_array(%(child)s::text, E'\n'))
            AND c.state IN ('terminal', 'cancelled')
    );

-- name: unfinished_children
-- The children a cancel of their parent cancels: a detached one outlives it.
SELECT task_id FROM runifold_tasks
WHERE parent_id = %(task_id)s AND state IN ('queued', 'leased', 'waiting') AND NOT detached
ORDER BY task_id;

-- name: pause_unleased
-- A queued or waiting task stops being due: resume makes it due again, and its replay
-- finds whatever fell due or arrived meanwhile (timers, signals, children).
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t SET paused = %(note)s, reason = %(note)s, ready_at = NULL, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state IN ('queued', 'waiting') AND t.paused IS NULL
RETURNING clock.now AS at;

-- name: request_pause
-- A running task learns of it from its next checkpoint commit or heartbeat.
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t SET paused = %(note)s, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state = 'leased' AND t.paused IS NULL
RETURNING clock.now AS at;

-- name: resume
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET paused = NULL, updated_at = clock.now,
    reason = CASE WHEN t.state = 'leased' THEN t.reason ELSE NULL END,
    ready_at = CASE WHEN t.state IN ('queued', 'waiting') THEN clock.now ELSE t.ready_at END
FROM clock
WHERE t.task_id = %(task_id)s AND t.paused IS NOT NULL
RETURNING clock.now AS at, t.state;

-- name: set_task_event
-- ctx.set_event, inside the fenced checkpoint commit that carries it (last write wins);
-- the notification wakes store.get_event's waiters when that transaction commits.
INSERT INTO runifold_task_events (task_id, key, value, set_at)
VALUES (%(task_id)s, %(key)s, %(value)s::jsonb, {now})
ON CONFLICT (task_id, key) DO UPDATE SET value = excluded.value, set_at = excluded.set_at
RETURNING pg_notify('runifold_results', runifold_task_events.task_id) AS notified;

-- name: task_event
-- Whether the task exists and, if it published it, event key's value: one read.
SELECT t.task_id, e.value::text AS value
FROM runifold_tasks t
LEFT JOIN runifold_task_events e ON e.task_id = t.task_id AND e.key = %(key)s
WHERE t.task_id = %(task_id)s;

-- name: published_events
SELECT key, value::text AS value, set_at FROM runifold_task_events
WHERE task_id = %(task_id)s ORDER BY key;

-- name: prune_candidates
-- Retention (store/sql_retention.py): the next finished tasks after the cursor, in creation
-- order (index runifold_tasks_finished), last changed before the cutoff, and not failed on
-- an ambiguous effect nobody resolved (unless asked). Locked for the batch's deletes; a
-- row another transaction holds (an operator's requeue, a signal being refused) is
-- skipped, never waited for.
SELECT task_id, created_at, parent_id FROM runifold_tasks
WHERE state IN ('terminal', 'cancelled')
    AND (created_at, task_id) > (%(after_at)s::timestamptz, %(after_id)s::text)
    AND created_at < %(cutoff)s AND updated_at < %(cutoff)s
    AND (%(include_ambiguous)s OR ambiguous_effect IS NULL)
ORDER BY created_at, task_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: prune_families
-- Which of the tasks are parents, and whether each has an unfinished child: one scan of
-- the parent index for the batch (a correlated probe per candidate cost three times the
-- rest of the scan).
SELECT parent_id, bool_or(state IN ('queued', 'leased', 'waiting')) AS unfinished
FROM runifold_tasks WHERE parent_id = ANY(%(ids)s::text[])
GROUP BY parent_id;

-- name: stored_tasks
SELECT task_id FROM runifold_tasks WHERE task_id = ANY(%(ids)s::text[]);

-- name: prune_rows
-- A batch's tasks and every row of theirs, in one statement; the rows the batch locked,
-- so still finished, but the state is checked all the same. Its count is the tasks'.
WITH events AS (DELETE FROM runifold_events WHERE task_id = ANY(%(ids)s::text[])),
    journal AS (DELETE FROM runifold_journal WHERE task_id = ANY(%(ids)s::text[])),
    signals AS (DELETE FROM runifold_signals WHERE task_id = ANY(%(ids)s::text[])),
    resolutions AS (DELETE FROM runifold_effect_resolutions WHERE task_id = ANY(%(ids)s::text[])),
    published AS (DELETE FROM runifold_task_events WHERE task_id = ANY(%(ids)s::text[])),
    attributes AS (DELETE FROM runifold_task_attributes WHERE task_id = ANY(%(ids)s::text[])),
    streams AS (DELETE FROM runifold_task_streams WHERE task_id = ANY(%(ids)s::text[]))
DELETE FROM runifold_tasks
WHERE task_id = ANY(%(ids)s::text[]) AND state IN ('terminal', 'cancelled');

-- name: insert_schedule
-- A schedule declared for the first time is active from now: no tick before it is made.
INSERT INTO runifold_schedules (
    name, definition_name, definition_version, cron, every_s, timezone, input,
    active_since, declared_at, changed_at
) VALUES (
    %(name)s, %(definition_name)s, %(definition_version)s, %(cron)s, %(every_s)s, %(timezone)s,
    %(input)s, %(now)s, %(now)s, %(now)s
)
ON CONFLICT (name) DO NOTHING
RETURNING declared_at AS at;

-- name: lock_schedule
-- Pools reaching one tick at once take turns: the second sees the first's last_tick.
SELECT * FROM runifold_schedules WHERE name = %(name)s FOR UPDATE;

-- name: select_schedule
SELECT * FROM runifold_schedules WHERE name = %(name)s;

-- name: list_schedules
SELECT * FROM runifold_schedules ORDER BY name;

-- name: change_schedule
UPDATE runifold_schedules
SET definition_name = %(definition_name)s, definition_version = %(definition_version)s,
    cron = %(cron)s, every_s = %(every_s)s, timezone = %(timezone)s, input = %(input)s,
    changed_at = %(now)s
WHERE name = %(name)s;

-- name: redeclare_schedule
-- declared_at is the last declaration: what schedules checks against live workers' starts.
UPDATE runifold_schedules SET declared_at = %(now)s WHERE name = %(name)s;

-- name: remove_schedule
-- Its tick tasks are not touched: they are tasks like any other.
DELETE FROM runifold_schedules WHERE name = %(name)s RETURNING *;

-- name: record_tick
UPDATE runifold_schedules SET last_tick = %(tick)s WHERE name = %(name)s;

-- name: pause_schedule
UPDATE runifold_schedules
SET paused_at = %(now)s, paused_by = %(actor)s, paused_reason = %(reason)s
WHERE name = %(name)s
RETURNING *;

-- name: resume_schedule
-- Active from now once resumed: the ticks that fell while paused are not made.
UPDATE runifold_schedules
SET active_since = CASE WHEN paused_at IS NULL THEN active_since ELSE %(now)s END,
    paused_at = NULL, paused_by = NULL, paused_reason = NULL
WHERE name = %(name)s
RETURNING *;

-- name: insert_schedule_event
INSERT INTO runifold_schedule_events (name, at, kind, actor, reason, detail)
VALUES (%(name)s, %(now)s, %(kind)s, %(actor)s, %(reason)s, %(detail)s);

-- name: schedule_events
SELECT name, at, kind, actor, reason, detail FROM runifold_schedule_events
WHERE name = %(name)s ORDER BY id;

-- name: task_page_filters
-- The task filters of list_tasks, and of list_tasks_page(_newest) applied to its window.
(%(state)s::text IS NULL OR state = %(state)s::text)
    AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
    AND (%(definition)s::text IS NULL OR definition_name = %(definition)s::text)
    AND (%(parent)s::text IS NULL OR parent_id = %(parent)s::text)
    AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    AND (%(attribute_count)s::int = 0 OR task_id IN (
        SELECT a.task_id
        FROM jsonb_to_recordset(%(attributes)s::jsonb) AS f(key text, kind text, value text)
        JOIN runifold_task_attributes a ON a.key = f.key AND a.kind = f.kind AND a.value = f.value
        GROUP BY a.task_id HAVING count(*) = %(attribute_count)s::int))

-- name: list_tasks_page
-- The dashboard's task list (sql_reads.list_tasks_page), oldest first: of the next
-- :scan tasks after the cursor (created_at, task_id), read from index
-- runifold_tasks_created, those matching the filters. A page reads at most :scan rows,
-- however deep it is and however few tasks match.
SELECT {query:task_columns}
FROM (
    SELECT * FROM runifold_tasks
    WHERE (created_at, task_id) > (%(after_at)s::timestamptz, %(after_id)s::text)
    ORDER BY created_at, task_id
    LIMIT %(scan)s
) AS w
WHERE {query:task_page_filters}
ORDER BY created_at, task_id
LIMIT %(limit)s;

-- name: list_tasks_page_newest
-- As list_tasks_page, newest first: the window is the :scan tasks before the cursor,
-- read backwards from the same index.
SELECT {query:task_columns}
FROM (
    SELECT * FROM runifold_tasks
    WHERE (created_at, task_id) < (%(after_at)s::timestamptz, %(after_id)s::text)
    ORDER BY created_at DESC, task_id DESC
    LIMIT %(scan)s
) AS w
WHERE {query:task_page_filters}
ORDER BY created_at DESC, task_id DESC
LIMIT %(limit)s;

-- name: task_window_end
-- The last of the next :scan tasks after the cursor and the task after it (none or one
-- row when the window reaches the newest task): where a page whose window held too few
-- matches lets the next one go on (index only).
SELECT created_at, task_id FROM runifold_tasks
WHERE (created_at, task_id) > (%(after_at)s::timestamptz, %(after_id)s::text)
ORDER BY created_at, task_id
LIMIT 2 OFFSET %(scan)s - 1;

-- name: task_window_end_newest
-- As task_window_end, walking newest first.
SELECT created_at, task_id FROM runifold_tasks
WHERE (created_at, task_id) < (%(after_at)s::timestamptz, %(after_id)s::text)
ORDER BY created_at DESC, task_id DESC
LIMIT 2 OFFSET %(scan)s - 1;

-- name: finished_per_interval
-- Tasks that finished since the given time, per interval (in seconds) counted from it, by
-- how they ended (index runifold_events_ended): the overview's throughput.
SELECT floor(extract(epoch FROM at - %(since)s::timestamptz) / %(interval)s)::int AS bucket,
    kind, COUNT(*) AS tasks
FROM runifold_events
WHERE kind IN ('completed', 'failed', 'cancelled') AND at >= %(since)s::timestamptz
GROUP BY 1, 2;

-- name: insert_login
-- An operator's login (store.start_login), by the digest of its id.
WITH clock AS (SELECT {now} AS now)
INSERT INTO runifold_logins (digest, started_at, expires_at)
SELECT %(digest)s, clock.now, clock.now + make_interval(secs => %(lifetime)s) FROM clock;

-- name: live_login
SELECT 1 AS live FROM runifold_logins WHERE digest = %(digest)s AND expires_at > {now};

-- name: end_login
DELETE FROM runifold_logins WHERE digest = %(digest)s;

-- Repairs (sql_repairs.py): fork, resuming a cancelled task, retry and cancel by filter.

-- name: fork_head
-- The forked task's checkpoint: the original's journal up to the fork point, and the
-- fingerprint it was written by, so only a worker with those steps claims it.
UPDATE runifold_tasks SET head = %(head)s::text::jsonb, fingerprint = %(fingerprint)s
WHERE task_id = %(task_id)s AND head IS NULL;

-- name: fork_journal_entry
INSERT INTO runifold_journal (task_id, journal, position, entry)
VALUES (%(task_id)s, %(journal)s, %(position)s, %(entry)s);

-- name: resume_cancelled
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET state = 'queued', outcome = NULL, reason = NULL, cancel_requested = NULL, claims_since_progress = 0,
    paused = NULL, ready_at = clock.now, updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.state = 'cancelled'
RETURNING clock.now AS at;

-- name: match_filters
-- The filters of retry and cancel by filter (TaskSelector); each NULL matches any task.
(%(definition)s::text IS NULL OR definition_name = %(definition)s::text)
    AND (%(version)s::int IS NULL OR definition_version = %(version)s::int)
    AND (%(state)s::text IS NULL OR state = %(state)s::text)
    AND (%(outcome)s::text IS NULL OR outcome = %(outcome)s::text)
    AND (%(reason_text)s::text IS NULL OR strpos(reason, %(reason_text)s::text) > 0)
    AND (%(tenant)s::text IS NULL OR tenant = %(tenant)s::text)
    AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
    AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s::timestamptz)
    AND (%(until)s::timestamptz IS NULL OR updated_at < %(until)s::timestamptz)

-- name: select_matching
SELECT task_id, created_at FROM runifold_tasks
WHERE {query:match_filters}
    AND (%(after_at)s::timestamptz IS NULL OR (created_at, task_id) > (%(after_at)s::timestamptz, %(after_id)s::text))
ORDER BY created_at, task_id
LIMIT %(limit)s;

-- name: count_matching
SELECT COUNT(*) AS tasks FROM runifold_tasks WHERE {query:match_filters};

-- name: upgrade_task
-- Move an unleased task to another version of its workflow: the head's definition and
-- the fingerprint are the new version's; only if nothing changed it since it was read.
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET definition_version = %(version)s, head = %(head)s::text::jsonb, fingerprint = %(fingerprint)s,
    updated_at = clock.now
FROM clock
WHERE t.task_id = %(task_id)s AND t.revision = %(revision)s AND t.definition_version = %(from_version)s
    AND t.state IN ('queued', 'waiting')
RETURNING clock.now AS at;

-- name: set_task_attribute
-- ctx.set_attributes, inside the fenced checkpoint commit that carries it (last write wins).
INSERT INTO runifold_task_attributes (task_id, key, kind, value, set_at)
VALUES (%(task_id)s, %(key)s, %(kind)s, %(value)s, {now})
ON CONFLICT (task_id, key) DO UPDATE
SET kind = excluded.kind, value = excluded.value, set_at = excluded.set_at;

-- name: task_attributes
SELECT key, kind, value FROM runifold_task_attributes WHERE task_id = %(task_id)s ORDER BY key;

-- name: create_schedule
-- store.create_schedule: a schedule created at run time, active from now; none if the name
-- is taken (declared by a registry, or created before).
INSERT INTO runifold_schedules (
    name, definition_name, definition_version, cron, every_s, timezone, input, queue, origin,
    active_since, declared_at, changed_at
) VALUES (
    %(name)s, %(definition_name)s, %(definition_version)s, %(cron)s, %(every_s)s, %(timezone)s, %(input)s, %(queue)s, 'created',
    %(now)s, %(now)s, %(now)s
)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: delete_created_schedule
-- store.delete_schedule: only a schedule created at run time (a registry would store a
-- declared one again). Its tick tasks are not touched.
DELETE FROM runifold_schedules WHERE name = %(name)s AND origin = 'created' RETURNING *;

-- name: created_schedules
SELECT * FROM runifold_schedules WHERE origin = 'created' ORDER BY name;

-- name: append_stream
-- ctx.write_stream, inside the fenced checkpoint commit that carries it: the next position
-- of the task's stream key, unless this writer's seq-th write of the run is there already
-- (a replay, or a step's re-run, writing it again). The notification wakes
-- store.read_stream's waiters when the transaction commits.
INSERT INTO runifold_task_streams (task_id, key, position, run, writer, seq, value, written_at)
SELECT %(task_id)s, %(key)s, COALESCE(MAX(position), 0) + 1, %(run)s, %(writer)s, %(seq)s,
    %(value)s::jsonb, {now}
FROM runifold_task_streams WHERE task_id = %(task_id)s AND key = %(key)s
ON CONFLICT (task_id, key, run, writer, seq) DO NOTHING
RETURNING pg_notify('runifold_results', runifold_task_streams.task_id) AS notified;

-- name: read_stream
SELECT position, value::text AS value FROM runifold_task_streams
WHERE task_id = %(task_id)s AND key = %(key)s AND position > %(after)s
ORDER BY position
LIMIT %(limit)s;

-- name: stream_fence
-- A step body's stream write (StepContext.write_stream): only while its lease holds. The
-- row lock orders it with the task's other writes (parallel branches' steps, commits), so
-- each append reads the positions the one before it committed.
SELECT 1 AS held FROM runifold_tasks
WHERE task_id = %(task_id)s AND fencing_token = %(token)s AND state = 'leased'
    AND lease_expires > {now}
FOR UPDATE;

-- name: lock_flow_key
-- An enqueue with a dedup or debounce key: enqueues of the same key take turns (a
-- transaction-level lock, so it holds through PgBouncer's transaction pooling).
SELECT pg_advisory_xact_lock(hashtextextended('runifold:' || %(key)s, 0)) IS NULL AS locked;

-- name: dedup_within
-- The newest task of a dedup key created within the window (index runifold_tasks_dedup).
SELECT task_id FROM runifold_tasks
WHERE dedup_key = %(dedup_key)s AND created_at > {now} - make_interval(secs => %(window)s)
ORDER BY created_at DESC LIMIT 1;

-- name: singleton_unfinished
-- A singleton key's unfinished task, unless a cancel is already on its way to it.
SELECT task_id FROM runifold_tasks
WHERE dedup_key = %(dedup_key)s AND state IN ('queued', 'waiting', 'leased') AND cancel_requested IS NULL
ORDER BY created_at DESC LIMIT 1;

-- name: debounce_fold
-- A debounced enqueue: the key's queued task that never ran a step takes the new input
-- and is due a window after now (never after its debounce_until). A claim that locked it
-- first makes this wait, then find it leased: a new task is enqueued, no input is lost.
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET input = %(input)s::text::jsonb, input_text = %(input)s::text,
    ready_at = LEAST(clock.now + make_interval(secs => %(debounce)s),
        COALESCE(t.debounce_until, clock.now + make_interval(secs => %(debounce)s))),
    updated_at = clock.now
FROM clock
WHERE t.debounce_key = %(debounce_key)s AND t.state = 'queued' AND t.head IS NULL
    AND t.definition_name = %(definition_name)s AND t.definition_version = %(definition_version)s
    AND t.tenant = %(tenant)s AND t.paused IS NULL
RETURNING t.task_id, t.ready_at, clock.now AS at;

-- name: set_flow_limit
INSERT INTO runifold_flow_limits (scope, target, max_running, rate_count, rate_period, set_at)
VALUES (%(scope)s, %(target)s, %(max_running)s, %(rate_count)s,
    make_interval(secs => %(rate_period)s::float8), {now})
ON CONFLICT (scope, target) DO UPDATE SET max_running = excluded.max_running,
    rate_count = excluded.rate_count, rate_period = excluded.rate_period, set_at = excluded.set_at;

-- name: remove_flow_limit
DELETE FROM runifold_flow_limits WHERE scope = %(scope)s AND target = %(target)s RETURNING scope;

-- name: flow_limits
SELECT scope, target, max_running, rate_count, EXTRACT(EPOCH FROM rate_period)::float8 AS rate_period
FROM runifold_flow_limits ORDER BY scope, target;

-- name: flow_limited_groups
-- Part of flow_group_stats and flow_groups_of_task: each of their groups (scope, name)
-- with the limit that applies to it.
limited AS (
    SELECT g.scope, g.name, l.target, l.max_running, l.rate_count, l.rate_period
    FROM groups g JOIN limits l ON {query:flow_group_limit}
)

-- name: flow_group_counts
-- Part of flow_group_stats and flow_groups_of_task: group g's running tasks, its claims
-- within the window of its rate (g.rate_period) and the oldest of them.
    (SELECT COUNT(*) FROM runifold_tasks r WHERE r.state = 'leased' AND r.lease_expires > clock.now
        AND CASE g.scope WHEN 'key' THEN r.concurrency_key WHEN 'definition' THEN r.definition_name
            ELSE r.queue END = g.name) AS running,
    (SELECT COUNT(*) FROM runifold_flow_claims c WHERE c.scope = g.scope AND c.name = g.name
        AND c.at > clock.now - COALESCE(g.rate_period, INTERVAL '0')) AS claimed_in_window,
    (SELECT MIN(c.at) FROM runifold_flow_claims c WHERE c.scope = g.scope AND c.name = g.name
        AND c.at > clock.now - COALESCE(g.rate_period, INTERVAL '0')) AS oldest_claim_at

-- name: flow_group_stats
-- Every group a limit applies to that has tasks running, ready or claimed within its
-- window: its running count, its claims in the window, its ready tasks, the oldest
-- claim in the window (ops: stats, the dashboard, metrics).
WITH clock AS (SELECT {now} AS now),
limits AS (SELECT scope, target, max_running, rate_count, rate_period FROM runifold_flow_limits),
groups AS (
    SELECT DISTINCT 'key' AS scope, concurrency_key AS name FROM runifold_tasks
        WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL
            AND EXISTS (SELECT 1 FROM limits WHERE scope = 'key')
    UNION SELECT scope, name FROM runifold_flow_claims
    UNION SELECT scope, target FROM limits WHERE scope <> 'key'
),
{query:flow_limited_groups}
SELECT g.scope, g.name, g.target, g.max_running, g.rate_count,
    EXTRACT(EPOCH FROM g.rate_period)::float8 AS rate_period, clock.now AS at,
    {query:flow_group_counts},
    (SELECT COUNT(*) FROM runifold_tasks w WHERE w.state IN ('queued', 'waiting') AND w.ready_at <= clock.now
        AND w.paused IS NULL
        AND CASE g.scope WHEN 'key' THEN w.concurrency_key WHEN 'definition' THEN w.definition_name
            ELSE w.queue END = g.name) AS waiting
FROM limited g, clock
ORDER BY g.scope, g.name;

-- name: age_priorities
-- Priority aging (store.age_priorities): a ready task gains one priority level for each
-- %(waited)s seconds it has been ready, up to %(up_to)s (never lowered; counted from its
-- priority at enqueue, kept in base_priority), so low priority work is not starved.
WITH clock AS (SELECT {now} AS now)
UPDATE runifold_tasks AS t
SET base_priority = COALESCE(t.base_priority, t.priority),
    priority = LEAST(%(up_to)s, COALESCE(t.base_priority, t.priority)
        + floor(EXTRACT(EPOCH FROM clock.now - t.ready_at) / %(waited)s)::int)
FROM clock
WHERE t.state IN ('queued', 'waiting') AND t.ready_at IS NOT NULL
    AND t.ready_at <= clock.now - make_interval(secs => %(waited)s) AND t.paused IS NULL
    AND t.priority < %(up_to)s
    AND LEAST(%(up_to)s, COALESCE(t.base_priority, t.priority)
        + floor(EXTRACT(EPOCH FROM clock.now - t.ready_at) / %(waited)s)::int) > t.priority
RETURNING t.task_id;

-- name: flow_groups_of_task
-- flow_group_stats for the groups of one task (its key, definition and queue) that a
-- limit applies to, without the waiting count: why a ready task is held (explain_reasons).
WITH clock AS (SELECT {now} AS now),
limits AS (SELECT scope, target, max_running, rate_count, rate_period FROM runifold_flow_limits),
groups AS (
    SELECT 'key'::text AS scope, %(concurrency_key)s::text AS name WHERE %(concurrency_key)s::text IS NOT NULL
    UNION ALL SELECT 'definition', %(definition_name)s::text
    UNION ALL SELECT 'queue', %(queue)s::text
),
{query:flow_limited_groups}
SELECT g.scope, g.name, g.target, g.max_running, g.rate_count,
    EXTRACT(EPOCH FROM g.rate_period)::float8 AS rate_period, clock.now AS at,
    {query:flow_group_counts},
    0 AS waiting
FROM limited g, clock;
