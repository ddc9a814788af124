-- Named queries for the SQLite store. {now} is store time in integer epoch microseconds.
-- Every write under a lease checks task id, fencing token, state and expiry in its
-- WHERE clause; checkpoint writes also check the revision they extend.

-- name: now
SELECT {now} AS now;

-- name: insert_task
INSERT INTO runifold_tasks (
    task_id, definition_name, definition_version, tenant, input, priority, state,
    ready_at, created_at, updated_at, parent_id, trace_context, queue, detached,
    concurrency_key, dedup_key, debounce_key, debounce_until
) VALUES (
    :task_id, :definition_name, :definition_version, :tenant, :input, :priority, 'queued',
    MAX(:now + COALESCE(:debounce, 0), COALESCE(:not_before, :now)), :now, :now, :parent_id,
    :trace_context, :queue, :detached, :concurrency_key, :dedup_key, :debounce_key, :now + :debounce_max
)
ON CONFLICT (task_id) DO NOTHING
RETURNING :now AS at;

-- name: insert_tasks_bulk
-- enqueue_many's tasks without flow options in one statement: :tasks is a JSON array of
-- [task_id, definition_name, definition_version, tenant, input (JSON text as a string),
-- priority, not_before, parent_id, queue, detached, concurrency_key], one a task. A task
-- whose id is stored already is not returned (the caller answers for it one by one). The
-- tasks are stamped a microsecond apart, in the batch's order and none after now: the
-- claim serves tasks of one priority by their ready time, so a batch keeps its order as
-- tasks enqueued one by one do.
INSERT INTO runifold_tasks (
    task_id, definition_name, definition_version, tenant, input, priority, state,
    ready_at, created_at, updated_at, parent_id, trace_context, queue, detached, concurrency_key
)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),
    json_extract(value, '$[3]'), json_extract(value, '$[4]'), json_extract(value, '$[5]'), 'queued',
    MAX(at, COALESCE(json_extract(value, '$[6]'), at)), at, at, json_extract(value, '$[7]'),
    :trace_context, json_extract(value, '$[8]'), json_extract(value, '$[9]'), json_extract(value, '$[10]')
FROM (SELECT value, key, :now - (json_array_length(:tasks) - 1 - key) AS at FROM json_each(:tasks))
WHERE true  -- an INSERT ... SELECT takes an ON CONFLICT clause only after a WHERE
ORDER BY key
ON CONFLICT (task_id) DO NOTHING
RETURNING task_id, created_at AS at;

-- name: insert_enqueued_events
-- The enqueued events of insert_tasks_bulk's new tasks: :events is a JSON array of
-- [task_id, detail (JSON text as a string), the task's created_at], in the batch's order.
INSERT INTO runifold_events (task_id, at, kind, detail)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[2]'), 'enqueued', json_extract(value, '$[1]')
FROM json_each(:events)
ORDER BY key;

-- name: select_task
SELECT * FROM runifold_tasks WHERE task_id = :task_id;

-- name: select_tasks
SELECT * FROM runifold_tasks WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: claimable_admitted_tenants
-- Part of claimable_tasks and claimable_routed_tasks (each includes it by name): the
-- tenants a claim may lease for, each with its room under its lease limit and its budget.
tenants AS (
    SELECT p.tenant, p.served_at,
        CASE WHEN p.max_leased IS NULL THEN :limit ELSE MIN(:limit, p.max_leased - (
            SELECT COUNT(*) FROM runifold_tasks l
            WHERE l.tenant = p.tenant AND l.state = 'leased' AND l.lease_expires > :now
        )) END AS room
    FROM runifold_tenants p
    WHERE CASE WHEN p.budget_cost IS NULL THEN 1 ELSE (
        SELECT COALESCE(SUM(ch.cost), 0) FROM runifold_tenant_charges ch
        WHERE ch.tenant = p.tenant AND ch.at > :now - p.budget_window_us
    ) < p.budget_cost END
)

-- name: claimable_flow
-- Part of claimable_tasks and claimable_routed_tasks: flow control by key (sql_flow.py).
-- The limits, the unexpired leases they count, the claims in each rate's window, and the
-- groups closed now (at max_running, or out of rate in their window): no claim reads a
-- closed group's tasks, so a full key never holds back the tasks behind it. A group is
-- closed by either limit alone, so the two are found apart, each only where a limit of
-- its kind is set.
-- Not materialized: each lookup of a group's limit reads the table's primary key.
limits AS NOT MATERIALIZED (
    SELECT scope, target, max_running, rate_count, rate_period_us FROM runifold_flow_limits
),
floors AS MATERIALIZED (
    -- Each scope's lowest max_running: a group with fewer running is open to it.
    SELECT scope, MIN(max_running) AS floor FROM limits WHERE max_running IS NOT NULL GROUP BY scope
),
running AS MATERIALIZED (
    -- For a definition's or a queue's max_running (a key's running tasks are counted
    -- where its tasks are read: flow_key_open), tenant by tenant, as each tenant's room
    -- counts them (a search of the leased index).
    SELECT l.definition_name, l.queue
    FROM runifold_tenants p CROSS JOIN runifold_tasks l INDEXED BY runifold_tasks_leased
    WHERE l.tenant = p.tenant AND l.state = 'leased' AND l.lease_expires > :now
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
        WHERE scope = 'key' AND at > :now - (
            SELECT MAX(rate_period_us) FROM limits WHERE scope = 'key' AND rate_count IS NOT NULL)
    ) g, limits l
    WHERE {query:flow_group_limit} AND l.rate_count IS NOT NULL
),
flow_closed AS MATERIALIZED (
    SELECT g.scope, g.name FROM running_groups g JOIN floors f ON f.scope = g.scope, limits l
    WHERE g.n >= f.floor AND {query:flow_group_limit} AND l.max_running <= g.n
    UNION ALL SELECT scope, name FROM rate_used WHERE room <= 0
),

-- name: claimable_flow@unflowed
-- With no flow limit set, nothing to count.

-- name: flow_window_claims
-- Part of claimable_flow: the claims of group g (g.scope, g.name) in the window of its
-- limit l's rate: its last claim's number less its first one in the window (claims are
-- numbered in order, per group), two index probes however many the window holds.
COALESCE((
    SELECT c.seq FROM runifold_flow_claims c WHERE c.scope = g.scope AND c.name = g.name
    ORDER BY c.at DESC, c.seq DESC LIMIT 1
) - (
    SELECT c.seq FROM runifold_flow_claims c
    WHERE c.scope = g.scope AND c.name = g.name AND c.at > :now - l.rate_period_us
    ORDER BY c.at, c.seq LIMIT 1
) + 1, 0)

-- name: flow_group_room
-- Part of claimable_flow_admitted: the room of group g (g.scope, g.name, g.n its running
-- tasks) under the limit l that applies to it, u its rate's room (NULL: no claim counted).
MIN(COALESCE(l.max_running - g.n, :limit), COALESCE(u.room, l.rate_count, :limit))

-- name: flow_group_limit
-- Part of the claims' flow control and of the flow stats: the limit row l of group g. A
-- key's limit is the row naming it, else the longest prefix pattern ("export:*") it
-- matches.
l.scope = g.scope AND l.target = CASE WHEN g.scope <> 'key' THEN g.name ELSE (
        SELECT k.target FROM limits k
        WHERE k.scope = 'key' AND (k.target = g.name OR (substr(k.target, -1) = '*'
            AND substr(g.name, 1, length(k.target) - 1) = substr(k.target, 1, length(k.target) - 1)))
        -- A pattern: by length; a name matched exactly, first.
        ORDER BY CASE WHEN substr(k.target, -1) = '*' THEN length(k.target) ELSE 1000000 END DESC LIMIT 1
    ) END

-- name: claimable_flow_open
-- Part of the claims' scans of ready tasks (alias x): not in a closed group, and its key
-- (if a key's max_running applies to it) below that limit.
AND (NOT EXISTS (SELECT 1 FROM flow_closed) OR (
    NOT EXISTS (SELECT 1 FROM flow_closed f WHERE f.scope = 'key' AND f.name = x.concurrency_key)
    AND NOT EXISTS (SELECT 1 FROM flow_closed f WHERE f.scope = 'definition' AND f.name = x.definition_name)
    AND NOT EXISTS (SELECT 1 FROM flow_closed f WHERE f.scope = 'queue' AND f.name = x.queue)))
AND (x.concurrency_key IS NULL OR NOT EXISTS (SELECT 1 FROM floors WHERE scope = 'key')
    OR NOT EXISTS (
        SELECT 1 FROM limits l, (SELECT 'key' AS scope, x.concurrency_key AS name) g
        WHERE {query:flow_group_limit} AND l.max_running IS NOT NULL AND l.max_running <= (
            SELECT COUNT(*) FROM runifold_tasks r INDEXED BY runifold_tasks_leased_key
            WHERE r.concurrency_key = x.concurrency_key AND r.state = 'leased' AND r.lease_expires > :now)))

-- name: claimable_flow_open@unflowed
-- With no flow limit set, every group is open.

-- name: claim_candidate
-- Part of the claims' candidates: what a claim reads of a task it may lease (t) and of
-- its tenant's admission (p).
t.task_id, t.tenant, t.state, t.worker_id, t.ready_at, t.updated_at, t.waiting_for_signal, t.priority,
    p.served_at, p.room, t.concurrency_key, t.definition_name, t.queue

-- name: claimable_in_turns
-- Part of claimable_tasks and claimable_routed_tasks: the candidates (each admitted
-- tenant's expired leases and first ready tasks, as "pool") within the room of their
-- flow-control groups (each group's candidates ranked, and those past its room dropped),
-- ranked within their tenant, in claim order. Within a tenant each key's first task goes
-- before any key's second. An expired lease goes before new work of the same priority:
-- its worker vanished, and it has waited a lease already.
{query:claimable_flow_admitted}
candidates AS (
    SELECT *, ROW_NUMBER() OVER (
        PARTITION BY tenant ORDER BY priority DESC, state = 'leased' DESC, key_turn, ready_at
    ) AS turn
    FROM admitted
)
SELECT task_id, tenant, state, worker_id, ready_at, updated_at, waiting_for_signal, route_fingerprint,
    concurrency_key, definition_name, queue, key_rated, definition_rated, queue_rated
FROM candidates WHERE turn <= room
ORDER BY turn, served_at IS NOT NULL, served_at, priority DESC, state = 'leased' DESC, ready_at
LIMIT :limit

-- name: claimable_flow_admitted
-- Part of claimable_in_turns: the candidates within the room of their flow-control groups
-- (each group's candidates ranked, and those past its room dropped).
pool_groups AS MATERIALIZED (
    SELECT g.scope, g.name, {query:flow_group_room} AS room, l.rate_count IS NOT NULL AS rated
    FROM (
        SELECT p.scope, p.name, CASE WHEN p.scope <> 'key' THEN COALESCE(r.n, 0) ELSE (
                SELECT COUNT(*) FROM runifold_tasks t INDEXED BY runifold_tasks_leased_key
                WHERE t.concurrency_key = p.name AND t.state = 'leased' AND t.lease_expires > :now
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
        kg.rated AS key_rated, dg.rated AS definition_rated, qg.rated AS queue_rated,
        ROW_NUMBER() OVER (
            PARTITION BY p.concurrency_key ORDER BY p.priority DESC, p.state = 'leased' DESC, p.ready_at
        ) AS key_turn,
        -- A definition's or a queue's turn matters only when its room is below the
        -- claim's limit (otherwise the limit alone keeps the claim within it): counted
        -- then, among the few candidates, rather than ranked by a window every time.
        CASE WHEN dg.room IS NULL OR dg.room >= :limit THEN 1 ELSE 1 + (
            SELECT COUNT(*) FROM pool q WHERE q.definition_name = p.definition_name
                AND (-q.priority, q.state <> 'leased', q.ready_at, q.task_id)
                    < (-p.priority, p.state <> 'leased', p.ready_at, p.task_id)
        ) END AS definition_turn,
        CASE WHEN qg.room IS NULL OR qg.room >= :limit THEN 1 ELSE 1 + (
            SELECT COUNT(*) FROM pool q WHERE q.queue = p.queue
                AND (-q.priority, q.state <> 'leased', q.ready_at, q.task_id)
                    < (-p.priority, p.state <> 'leased', p.ready_at, p.task_id)
        ) END AS queue_turn
    FROM pool p
    LEFT JOIN pool_groups kg ON kg.scope = 'key' AND kg.name = p.concurrency_key
    LEFT JOIN pool_groups dg ON dg.scope = 'definition' AND dg.name = p.definition_name
    LEFT JOIN pool_groups qg ON qg.scope = 'queue' AND qg.name = p.queue
),
admitted AS (
    SELECT * FROM flowed
    WHERE (key_room IS NULL OR key_turn <= key_room)
        AND (definition_room IS NULL OR definition_turn <= definition_room)
        AND (queue_room IS NULL OR queue_turn <= queue_room)
),

-- name: claimable_flow_admitted@unflowed
-- With no flow limit set, every candidate, each key's first task still before its second.
admitted AS (
    SELECT p.*, 0 AS key_rated, 0 AS definition_rated, 0 AS queue_rated,
        ROW_NUMBER() OVER (
            PARTITION BY p.concurrency_key ORDER BY p.priority DESC, p.state = 'leased' DESC, p.ready_at
        ) AS key_turn
    FROM pool p
),

-- name: flow_limits_set
-- First statement of a claim: under its BEGIN IMMEDIATE, whether it needs flow control.
SELECT EXISTS (SELECT 1 FROM runifold_flow_limits) AS limits_set;

-- name: claimable_tasks
-- Admit tenants (room under their lease limit, charges under their budget), take each
-- admitted tenant's expired leases and first ready tasks, and order them in turns: every
-- tenant's first task before any tenant's second, the least recently served tenant first
-- within a turn. Priority orders tasks within a tenant. The caller's BEGIN IMMEDIATE
-- makes it exact.
WITH {query:claimable_admitted_tenants},
{query:claimable_flow}
pool AS (
    SELECT {query:claim_candidate}, NULL AS route_fingerprint
    FROM tenants p JOIN runifold_tasks t ON t.task_id IN (
        SELECT x.task_id FROM runifold_tasks x
        WHERE x.tenant = p.tenant AND x.state IN ('queued', 'waiting', 'leased') AND x.state <> 'leased'
            AND x.ready_at IS NOT NULL AND x.ready_at <= :now AND x.paused IS NULL
            {query:claimable_flow_open}
        ORDER BY x.priority DESC, x.ready_at
        LIMIT :limit
    )
    WHERE p.room > 0
    UNION ALL
    SELECT {query:claim_candidate}, NULL AS route_fingerprint
    FROM tenants p JOIN runifold_tasks t ON t.task_id IN (
        SELECT x.task_id FROM runifold_tasks x INDEXED BY runifold_tasks_leased
        WHERE x.tenant = p.tenant AND x.state = 'leased' AND x.lease_expires <= :now
            AND x.paused IS NULL
            {query:claimable_flow_open}
        ORDER BY x.priority DESC, x.lease_expires
        LIMIT :limit
    )
    WHERE p.room > 0
),
{query:claimable_in_turns};

-- name: claimable_routed_tasks
-- claimable_tasks for a worker's routes (:routes, a JSON array of [queue, name, version,
-- fingerprint]): each admitted tenant's first ready tasks of each route, read from
-- runifold_tasks_routed in claim order, and its expired leases of each route, read from
-- runifold_tasks_leased (the few whose worker vanished), then that tenant's best of them.
-- A task with a head is taken only by the fingerprint it was claimed with (or, claimed by
-- a route-less claim, by any); lease_task gives a task without a head the route's
-- fingerprint.
WITH {query:claimable_admitted_tenants},
{query:claimable_flow}
routes AS MATERIALIZED (
    SELECT json_extract(value, '$[0]') AS queue, json_extract(value, '$[1]') AS name,
        json_extract(value, '$[2]') AS version, json_extract(value, '$[3]') AS fingerprint
    FROM json_each(:routes)
),
pool AS (
    SELECT {query:claim_candidate}, r.fingerprint AS route_fingerprint
    FROM tenants p CROSS JOIN routes r JOIN runifold_tasks t ON t.task_id IN (
        SELECT x.task_id FROM runifold_tasks x INDEXED BY runifold_tasks_routed
        WHERE x.tenant = p.tenant AND x.queue = r.queue AND x.definition_name = r.name
            AND x.definition_version = r.version
            -- As the index's predicate says it (SQLite matches its terms as written).
            AND x.state IN ('queued', 'waiting', 'leased') AND x.state <> 'leased'
            AND x.ready_at IS NOT NULL AND x.ready_at <= :now AND x.paused IS NULL
            {query:claimable_flow_open}
            AND (x.head IS NULL OR x.fingerprint IS NULL OR x.fingerprint = r.fingerprint)
        ORDER BY x.priority DESC, x.ready_at
        LIMIT :limit
    )
    WHERE p.room > 0
    UNION ALL
    SELECT {query:claim_candidate}, r.fingerprint AS route_fingerprint
    FROM tenants p CROSS JOIN routes r JOIN runifold_tasks t ON t.task_id IN (
        SELECT x.task_id FROM runifold_tasks x INDEXED BY runifold_tasks_leased
        WHERE x.tenant = p.tenant AND x.state = 'leased' AND x.lease_expires <= :now
            AND x.queue = r.queue AND x.definition_name = r.name AND x.definition_version = r.version
            AND x.paused IS NULL
            {query:claimable_flow_open}
            AND (x.head IS NULL OR x.fingerprint IS NULL OR x.fingerprint = r.fingerprint)
        ORDER BY x.priority DESC, x.lease_expires
        LIMIT :limit
    )
    WHERE p.room > 0
),
{query:claimable_in_turns};

-- name: mark_tenant_served
UPDATE runifold_tenants SET served_at = :now WHERE tenant = :tenant;

-- name: lease_task
UPDATE runifold_tasks
SET state = 'leased', worker_id = :worker_id, fencing_token = fencing_token + 1,
    lease_expires = :now + :lease, ready_at = :now + :lease,
    claims_since_progress = claims_since_progress + 1, reason = NULL, waiting_for_signal = NULL,
    waiting_for_child = NULL,
    updated_at = :now,
    -- A routed claim gives a task without a head its route's fingerprint; a task
    -- checkpointed under a route-less claim gets its head's.
    fingerprint = CASE WHEN head IS NULL THEN :fingerprint
        WHEN fingerprint IS NULL AND json_valid(head) THEN json_extract(head, '$.definition.fingerprint')
        ELSE fingerprint END
WHERE task_id = :task_id
RETURNING task_id, tenant, definition_name, definition_version, input, revision,
    head, fencing_token, lease_expires, claims_since_progress, cancel_requested, trace_context,
    EXISTS (SELECT 1 FROM runifold_effect_resolutions r WHERE r.task_id = :task_id) AS resolved;

-- name: write_applied
-- A fenced write refused when sent again after an attempt that failed: the row as that
-- attempt left it, if it did apply (its token, the revision after it).
SELECT revision, state, cancel_requested, paused, ready_at FROM runifold_tasks
WHERE task_id = :task_id AND fencing_token = :token AND revision = :revision;

-- name: forgive_lost_claim
-- A claim whose worker lived through losing its lease (cut off from the store) no longer
-- counts toward a crash loop: taken back while no progress was committed since it was
-- made (the revision it saw) nor the lease ended by its holder (a release took its own
-- claim back already), and once only (its lease_lost event).
UPDATE runifold_tasks SET claims_since_progress = claims_since_progress - 1
WHERE task_id = :task_id AND revision = :revision
    AND (fencing_token > :token OR (fencing_token = :token AND state = 'leased'))
    AND claims_since_progress > 0 AND state IN ('queued', 'waiting', 'leased')
    AND NOT EXISTS (
        SELECT 1 FROM runifold_events e
        WHERE e.task_id = :task_id AND e.kind = 'lease_lost' AND e.fencing_token = :token
    )
RETURNING task_id;

-- name: resolutions_for_task
SELECT effect_key, applied, result, actor, reason
FROM runifold_effect_resolutions WHERE task_id = :task_id;

-- name: heartbeat
UPDATE runifold_tasks
SET lease_expires = {now} + :lease, ready_at = {now} + :lease
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > {now}
RETURNING lease_expires, cancel_requested, paused;

-- name: commit_checkpoint
UPDATE runifold_tasks
SET head = :head, revision = revision + 1, claims_since_progress = 0,
    updated_at = {now}
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > {now} AND revision = :revision
RETURNING revision, cancel_requested, paused;

-- name: suspend
UPDATE runifold_tasks
SET state = 'waiting', head = :head, revision = revision + 1,
    claims_since_progress = 0, lease_expires = NULL, reason = COALESCE(paused, :reason), updated_at = :now,
    waiting_for_signal = :signal, waiting_approval = :approval, waiting_for_child = :child,
    -- A signal that arrived while the worker was deciding to wait wakes the task now.
    ready_at = CASE WHEN EXISTS (
        SELECT 1 FROM runifold_signals s
        WHERE s.task_id = :task_id AND s.consumed_at IS NULL
            AND instr(char(10) || :signal || char(10), char(10) || s.name || char(10)) > 0
    ) THEN :now ELSE :wake_at END
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now AND revision = :revision AND cancel_requested IS NULL
RETURNING :now AS at;

-- name: retry
UPDATE runifold_tasks
SET state = 'queued', head = :head, revision = revision + 1,
    claims_since_progress = 0, ready_at = :now + :delay, lease_expires = NULL,
    reason = :reason, updated_at = :now
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now AND revision = :revision AND cancel_requested IS NULL
RETURNING ready_at;

-- name: release
UPDATE runifold_tasks
SET state = 'queued', ready_at = :now + :delay, lease_expires = NULL,
    claims_since_progress = MAX(claims_since_progress - 1, 0), reason = :reason,
    updated_at = :now
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now
RETURNING task_id;

-- name: leases_held_by
-- The unexpired leases a worker holds (read through the partial index of leased tasks).
SELECT task_id, tenant, worker_id, fencing_token, lease_expires, cancel_requested, paused
FROM runifold_tasks
WHERE state = 'leased' AND worker_id = :worker_id AND lease_expires > {now}
ORDER BY task_id;

-- name: hand_back_dead_lease
-- The lease of a worker whose process is gone expires now: claimable at once, as after
-- its lease ran out (the claim still counts as an attempt, and records the expired owner).
UPDATE runifold_tasks
SET lease_expires = :now, ready_at = :now, updated_at = :now
WHERE task_id = :task_id AND fencing_token = :token AND worker_id = :worker_id
    AND state = 'leased' AND lease_expires > :now
RETURNING :now AS at;

-- name: complete
UPDATE runifold_tasks
SET state = 'terminal', outcome = 'completed', head = :head,
    revision = revision + 1, result = :result, ready_at = NULL, lease_expires = NULL,
    reason = NULL, updated_at = :now
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now AND revision = :revision AND cancel_requested IS NULL
RETURNING task_id, parent_id;

-- name: pending_cancel
-- Why complete, suspend or retry changed no row: the lease still holds and only a cancel
-- request stood in the way (no row: the lease was lost).
SELECT cancel_requested FROM runifold_tasks
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now AND revision = :revision AND cancel_requested IS NOT NULL;

-- name: fail
UPDATE runifold_tasks
SET state = 'terminal', outcome = 'failed', head = COALESCE(:head, head),
    revision = revision + 1, ready_at = NULL, lease_expires = NULL, reason = :reason,
    ambiguous_effect = :ambiguous_effect, updated_at = :now
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now AND revision = :revision
RETURNING task_id, parent_id;

-- name: requeue_resolved
UPDATE runifold_tasks
SET state = 'queued', outcome = NULL, ambiguous_effect = NULL, reason = NULL, cancel_requested = NULL,
    claims_since_progress = 0, ready_at = :now, updated_at = :now
WHERE task_id = :task_id AND state = 'terminal' AND ambiguous_effect = :effect_key
RETURNING :now AS at;

-- name: insert_resolution
INSERT INTO runifold_effect_resolutions
    (task_id, effect_key, applied, result, actor, reason, resolved_at)
VALUES (:task_id, :effect_key, :applied, :result, :actor, :reason, :now)
ON CONFLICT (task_id, effect_key) DO UPDATE SET
    applied = excluded.applied, result = excluded.result, actor = excluded.actor,
    reason = excluded.reason, resolved_at = excluded.resolved_at;

-- name: insert_event
INSERT INTO runifold_events (task_id, at, kind, worker_id, fencing_token, detail)
VALUES (:task_id, :now, :kind, :worker_id, :token, :detail);

-- name: task_events
SELECT * FROM runifold_events WHERE task_id = :task_id ORDER BY event_id;

-- name: set_clock_offset
UPDATE runifold_clock SET offset_us = :offset WHERE id = 1;

-- name: seconds_until_due
SELECT (MIN(ready_at) - {now}) / 1000000.0 AS due_in_s FROM runifold_tasks
WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL;

-- name: clock_reading
-- Store now, the shared offset, and the earliest ready_at of a task no worker holds and
-- no operator paused: the next time a claim could find work (the testing kit's skip).
SELECT {now} AS now, (SELECT offset_us FROM runifold_clock WHERE id = 1) AS clock_offset,
    (SELECT MIN(ready_at) FROM runifold_tasks
     WHERE state IN ('queued', 'waiting') AND ready_at IS NOT NULL AND paused IS NULL) AS next_due;

-- name: seconds_until_routed_due
-- seconds_until_due among the tasks a worker's routes can claim (:routes as in
-- claimable_routed_tasks): each route's earliest due time from runifold_tasks_routed_due.
SELECT (MIN((
    SELECT t.ready_at FROM runifold_tasks t
    WHERE t.queue = json_extract(r.value, '$[0]') AND t.definition_name = json_extract(r.value, '$[1]')
        AND t.definition_version = json_extract(r.value, '$[2]')
        AND t.state IN ('queued', 'waiting', 'leased') AND t.ready_at IS NOT NULL
        AND t.definition_version > 0  -- the term that lets this query, and only it, use the index
        AND (t.head IS NULL OR t.fingerprint IS NULL OR t.fingerprint = json_extract(r.value, '$[3]'))
    ORDER BY t.ready_at
    LIMIT 1
)) - {now}) / 1000000.0 AS due_in_s
FROM json_each(:routes) r;

-- name: requeue_failed
UPDATE runifold_tasks
SET state = 'queued', outcome = NULL, reason = NULL, cancel_requested = NULL, claims_since_progress = 0,
    ready_at = :now, updated_at = :now
WHERE task_id = :task_id AND state = 'terminal' AND outcome = 'failed'
    AND ambiguous_effect IS NULL
RETURNING :now AS at;

-- name: list_tasks
SELECT * FROM runifold_tasks
WHERE {query:task_page_filters}
ORDER BY created_at, task_id
LIMIT :limit;

-- name: list_children
-- list_tasks given a parent: read from the partial index runifold_tasks_parent (on the
-- filters' "IS NULL OR" form alone SQLite reads every task: 150 ms with a million).
SELECT * FROM runifold_tasks
WHERE parent_id = :parent AND {query:task_page_filters}
ORDER BY created_at, task_id
LIMIT :limit;

-- name: referenced_versions
SELECT definition_name, definition_version,
    SUM(state = 'queued') AS queued, SUM(state = 'leased') AS leased,
    SUM(state = 'waiting') AS waiting, SUM(state = 'terminal') AS recoverable,
    group_concat(DISTINCT json_extract(head, '$.definition.fingerprint')) AS fingerprints
FROM runifold_tasks
WHERE state IN ('queued', 'leased', 'waiting')
    OR (state = 'terminal' AND ambiguous_effect IS NOT NULL)
GROUP BY definition_name, definition_version
ORDER BY definition_name, definition_version;

-- name: queue_stats
-- The unfinished tasks from the partial indexes that hold only them (a due time:
-- runifold_tasks_routed, as the claim reads; none: runifold_tasks_unready), the finished
-- ones from the counters the triggers of migration 24 keep: flat however many finished
-- tasks are kept.
WITH unfinished AS (
    SELECT tenant, state, outcome, ready_at FROM runifold_tasks
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL
    UNION ALL
    SELECT tenant, state, outcome, ready_at FROM runifold_tasks
    WHERE state IN ('queued', 'waiting', 'leased') AND ready_at IS NULL
)
SELECT tenant, state, outcome, COUNT(*) AS count,
    ({now} - MIN(CASE WHEN state = 'queued' AND ready_at <= {now} THEN ready_at END))
        / 1000000.0 AS oldest_ready_age_s
FROM unfinished
GROUP BY tenant, state, outcome
UNION ALL
SELECT tenant, state, NULLIF(outcome, ''), SUM(count), NULL
FROM runifold_finished_counts
GROUP BY tenant, state, outcome
HAVING SUM(count) <> 0
ORDER BY tenant, state, outcome;

-- name: insert_signal
INSERT INTO runifold_signals (task_id, signal_id, name, payload, sender, reason, sent_at)
VALUES (:task_id, :signal_id, :name, :payload, :sender, :reason, :now)
ON CONFLICT (task_id, signal_id) DO NOTHING;

-- name: select_signal
SELECT name, payload FROM runifold_signals WHERE task_id = :task_id AND signal_id = :signal_id;

-- name: count_refused_signal
UPDATE runifold_tasks SET refused_signals = refused_signals + 1 WHERE task_id = :task_id;

-- name: count_pending_signals
SELECT COUNT(*) AS pending FROM runifold_signals WHERE task_id = :task_id AND consumed_at IS NULL;

-- name: wake_for_signal
-- Moves only ready_at: updated_at keeps the suspension time, so the claim that resumes
-- the task can tell how long it waited.
UPDATE runifold_tasks SET ready_at = :now
-- waiting_for_signal holds the names a wait takes, one a line.
WHERE task_id = :task_id AND state = 'waiting'
    AND instr(char(10) || waiting_for_signal || char(10), char(10) || :name || char(10)) > 0;

-- name: pending_signals
SELECT signal_id, name, payload, sender, reason, sent_at FROM runifold_signals
WHERE task_id = :task_id AND name = :name AND consumed_at IS NULL
ORDER BY sent_at, signal_id;

-- name: all_pending_signals
SELECT signal_id, name, payload, sender, reason, sent_at FROM runifold_signals
WHERE task_id = :task_id AND consumed_at IS NULL
ORDER BY sent_at, signal_id;

-- name: consume_signal
UPDATE runifold_signals SET consumed_at = :now
WHERE task_id = :task_id AND signal_id = :signal_id AND consumed_at IS NULL
RETURNING sender;

-- name: cancel_unleased
-- Only a task with nothing to undo: its checkpoint lists no more completed steps with a
-- compensation ("undo") than it has compensated.
UPDATE runifold_tasks
SET state = 'cancelled', ready_at = NULL, waiting_for_signal = NULL, reason = :reason,
    updated_at = :now
WHERE task_id = :task_id AND state IN ('queued', 'waiting')
    AND NOT (CASE WHEN json_valid(head) THEN COALESCE(json_array_length(head, '$.undo'), 0)
        > COALESCE(json_array_length(head, '$.compensated'), 0) ELSE 0 END)
RETURNING :now AS at, parent_id;

-- name: cancel_with_undo
-- A queued or waiting task with compensations to run: no step of its main function runs
-- again, but a worker claims it at once, sees cancel_requested, runs them and ends it
-- cancelled.
UPDATE runifold_tasks
SET state = 'queued', cancel_requested = :reason, ready_at = :now, waiting_for_signal = NULL, paused = NULL,
    reason = :reason || '; its compensations run next', updated_at = :now
WHERE task_id = :task_id AND state IN ('queued', 'waiting')
    AND (CASE WHEN json_valid(head) THEN COALESCE(json_array_length(head, '$.undo'), 0)
        > COALESCE(json_array_length(head, '$.compensated'), 0) ELSE 0 END)
RETURNING :now AS at;

-- name: request_cancel
UPDATE runifold_tasks SET cancel_requested = :reason, updated_at = :now
WHERE task_id = :task_id AND state = 'leased'
RETURNING :now AS at;

-- name: acknowledge_cancel
UPDATE runifold_tasks
SET state = 'cancelled', head = :head, revision = revision + 1, ready_at = NULL,
    lease_expires = NULL, reason = cancel_requested, updated_at = :now
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now AND revision = :revision
RETURNING reason, task_id, parent_id;

-- name: lock_task
-- BEGIN IMMEDIATE already serializes writers: a plain read is enough here.
SELECT tenant, state, cancel_requested, definition_name, definition_version, fencing_token,
    refused_signals, waiting_for_signal, waiting_approval
FROM runifold_tasks WHERE task_id = :task_id;

-- name: declare_signals
INSERT INTO runifold_definitions (definition_name, definition_version, fingerprint, signals, declared_at)
VALUES (:definition_name, :definition_version, :fingerprint, :signals, {now})
ON CONFLICT (definition_name, definition_version, fingerprint) DO NOTHING;

-- name: declared_signals
SELECT fingerprint, signals FROM runifold_definitions
WHERE definition_name = :definition_name AND definition_version = :definition_version
ORDER BY fingerprint;

-- name: register_worker
INSERT INTO runifold_workers (worker_id, host, pid, started_at, last_seen, stopped_at, definitions, queues)
VALUES (:worker_id, :host, :pid, {now}, {now}, NULL, :definitions, :queues)
ON CONFLICT (worker_id) DO UPDATE SET
    host = excluded.host, pid = excluded.pid, started_at = excluded.started_at,
    last_seen = excluded.last_seen, stopped_at = NULL, definitions = excluded.definitions,
    queues = excluded.queues;

-- name: worker_seen
UPDATE runifold_workers SET last_seen = {now} WHERE worker_id = :worker_id AND pid = :pid;

-- name: leases_of_worker
-- The unexpired leases one worker holds: a claim whose answer was lost with its
-- connection leaves some it does not know of (few rows: the leased tasks).
SELECT task_id, tenant, fencing_token, lease_expires, cancel_requested, paused FROM runifold_tasks
WHERE state = 'leased' AND worker_id = :worker_id AND lease_expires > {now};

-- name: worker_stopped
UPDATE runifold_workers SET stopped_at = {now}, last_seen = {now}
WHERE worker_id = :worker_id AND pid = :pid;

-- name: list_workers
SELECT worker_id, host, pid, started_at, last_seen, stopped_at, definitions, queues,
    ({now} - last_seen) / 1000000.0 AS silent_s
FROM runifold_workers ORDER BY worker_id;

-- name: set_tenant_policy
INSERT INTO runifold_tenants (tenant, max_leased, budget_cost, budget_window_us)
VALUES (:tenant, :max_leased, :budget_cost, :budget_window)
ON CONFLICT (tenant) DO UPDATE SET max_leased = excluded.max_leased,
    budget_cost = excluded.budget_cost, budget_window_us = excluded.budget_window_us;

-- name: tenant_admission
SELECT p.tenant, p.max_leased, p.budget_cost, p.budget_window_us AS budget_window, {now} AS at,
    (SELECT COUNT(*) FROM runifold_tasks l
        WHERE l.tenant = p.tenant AND l.state = 'leased' AND l.lease_expires > {now}) AS leased,
    (SELECT COALESCE(SUM(ch.cost), 0) FROM runifold_tenant_charges ch
        WHERE ch.tenant = p.tenant AND ch.at > {now} - p.budget_window_us) AS spent,
    (SELECT MIN(ch.at) FROM runifold_tenant_charges ch
        WHERE ch.tenant = p.tenant AND ch.at > {now} - p.budget_window_us) AS oldest_charge_at,
    (SELECT COUNT(*) FROM runifold_tasks r
        WHERE r.tenant = p.tenant AND r.state IN ('queued', 'waiting')
            AND r.ready_at IS NOT NULL AND r.ready_at <= {now}) AS ready
FROM runifold_tenants p
WHERE p.max_leased IS NOT NULL OR p.budget_cost IS NOT NULL
ORDER BY p.tenant;

-- name: continue_as_new
-- ctx.continue_as_new: the same task, queued afresh with a new input and the next run's
-- head; its journal rows go in the same transaction (clear_journal).
UPDATE runifold_tasks
SET state = 'queued', head = :head, input = :input, revision = revision + 1,
    claims_since_progress = 0, ready_at = :now, lease_expires = NULL, reason = NULL,
    updated_at = :now
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased'
    AND lease_expires > :now AND revision = :revision AND cancel_requested IS NULL
RETURNING :now AS at;

-- name: write_journal_entry
INSERT INTO runifold_journal (task_id, journal, position, entry)
VALUES (:task_id, :journal, :position, :entry)
ON CONFLICT (task_id, journal, position) DO UPDATE SET entry = excluded.entry;

-- name: drop_journal_entry
DELETE FROM runifold_journal WHERE task_id = :task_id AND journal = :journal AND position = :position;

-- name: clear_journal
DELETE FROM runifold_journal WHERE task_id = :task_id;

-- name: journal_rows
SELECT journal, position, entry FROM runifold_journal WHERE task_id = :task_id
ORDER BY journal, position;

-- name: journal_tail
-- The newest entries of the main journal, newest first (the caller puts them in order).
SELECT journal, position, entry FROM runifold_journal WHERE task_id = :task_id AND journal = ''
ORDER BY position DESC LIMIT :limit;

-- name: journal_length
SELECT COUNT(*) AS entries FROM runifold_journal WHERE task_id = :task_id AND journal = '';

-- name: wake_parent
-- A child ended: its parent, if it waits for this child, is due now (BEGIN IMMEDIATE
-- orders this against the parent's suspend, which checks for an ended child itself).
UPDATE runifold_tasks
-- waiting_for_child holds the children a wait takes (ctx.wait_any), one a line.
SET ready_at = CASE WHEN state = 'waiting'
    AND instr(char(10) || waiting_for_child || char(10), char(10) || :task_id || char(10)) > 0
    AND (ready_at IS NULL OR ready_at > :now) THEN :now ELSE ready_at END
WHERE task_id = :parent_id
RETURNING ready_at = :now AS woke;

-- name: wake_if_child_finished
-- After a suspend for child :child: the child ended before the suspend.
UPDATE runifold_tasks SET ready_at = :now
WHERE task_id = :task_id AND state = 'waiting' AND waiting_for_child = :child
    AND (ready_at IS NULL OR ready_at > :now)
    AND EXISTS (
        SELECT 1 FROM runifold_tasks c
        WHERE instr(char(10) || :child || char(10), char(10) || c.task_id || char(10)) > 0
            AND c.state IN ('terminal', 'cancelled')
    );

-- name: unfinished_children
-- The children a cancel of their parent cancels: a detached one outlives it.
SELECT task_id FROM runifold_tasks
WHERE parent_id = :task_id AND state IN ('queued', 'leased', 'waiting') AND detached = 0
ORDER BY task_id;

-- name: pause_unleased
-- A queued or waiting task stops being due: resume makes it due again, and its replay
-- finds whatever fell due or arrived meanwhile (timers, signals, children).
UPDATE runifold_tasks SET paused = :note, reason = :note, ready_at = NULL, updated_at = :now
WHERE task_id = :task_id AND state IN ('queued', 'waiting') AND paused IS NULL
RETURNING :now AS at;

-- name: request_pause
-- A running task learns of it from its next checkpoint commit or heartbeat.
UPDATE runifold_tasks SET paused = :note, updated_at = :now
WHERE task_id = :task_id AND state = 'leased' AND paused IS NULL
RETURNING :now AS at;

-- name: resume
UPDATE runifold_tasks
SET paused = NULL, updated_at = :now,
    reason = CASE WHEN state = 'leased' THEN reason ELSE NULL END,
    ready_at = CASE WHEN state IN ('queued', 'waiting') THEN :now ELSE ready_at END
WHERE task_id = :task_id AND paused IS NOT NULL
RETURNING :now AS at, state;

-- name: set_task_event
-- ctx.set_event, inside the fenced checkpoint commit that carries it (last write wins).
INSERT INTO runifold_task_events (task_id, key, value, set_at)
VALUES (:task_id, :key, :value, :now)
ON CONFLICT (task_id, key) DO UPDATE SET value = excluded.value, set_at = excluded.set_at;

-- name: task_event
-- Whether the task exists and, if it published it, event key's value: one read.
SELECT t.task_id, e.value AS value
FROM runifold_tasks t
LEFT JOIN runifold_task_events e ON e.task_id = t.task_id AND e.key = :key
WHERE t.task_id = :task_id;

-- name: published_events
SELECT key, value, set_at FROM runifold_task_events WHERE task_id = :task_id ORDER BY key;

-- name: prune_candidates
-- Retention (store/sql_retention.py): the next finished tasks after the cursor, in creation
-- order (index runifold_tasks_finished), last changed before the cutoff, and not failed on
-- an ambiguous effect nobody resolved (unless asked). BEGIN IMMEDIATE keeps them as they
-- are until the batch commits.
SELECT task_id, created_at, parent_id FROM runifold_tasks
WHERE state IN ('terminal', 'cancelled')
    AND (created_at, task_id) > (:after_at, :after_id)
    AND created_at < :cutoff AND updated_at < :cutoff
    AND (:include_ambiguous OR ambiguous_effect IS NULL)
ORDER BY created_at, task_id
LIMIT :limit;

-- name: prune_families
-- Which of the tasks are parents, and whether each has an unfinished child.
SELECT parent_id, max(state IN ('queued', 'leased', 'waiting')) AS unfinished
FROM runifold_tasks WHERE parent_id IN (SELECT value FROM json_each(:ids))
GROUP BY parent_id;

-- name: stored_tasks
SELECT task_id FROM runifold_tasks WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_events
-- A batch's tasks and every row of theirs, one table a statement (SqliteDialect.
-- prune_queries), the task rows last: their count is the batch's.
DELETE FROM runifold_events WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_journal
DELETE FROM runifold_journal WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_signals
DELETE FROM runifold_signals WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_resolutions
DELETE FROM runifold_effect_resolutions WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_task_events
DELETE FROM runifold_task_events WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_task_attributes
DELETE FROM runifold_task_attributes WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_task_streams
DELETE FROM runifold_task_streams WHERE task_id IN (SELECT value FROM json_each(:ids));

-- name: prune_tasks
DELETE FROM runifold_tasks
WHERE task_id IN (SELECT value FROM json_each(:ids)) AND state IN ('terminal', 'cancelled');

-- name: insert_schedule
-- A schedule declared for the first time is active from now: no tick before it is made.
INSERT INTO runifold_schedules (
    name, definition_name, definition_version, cron, every_s, timezone, input,
    active_since, declared_at, changed_at
) VALUES (
    :name, :definition_name, :definition_version, :cron, :every_s, :timezone, :input,
    :now, :now, :now
)
ON CONFLICT (name) DO NOTHING
RETURNING :now AS at;

-- name: lock_schedule
-- The caller's BEGIN IMMEDIATE already holds the database.
SELECT * FROM runifold_schedules WHERE name = :name;

-- name: select_schedule
SELECT * FROM runifold_schedules WHERE name = :name;

-- name: list_schedules
SELECT * FROM runifold_schedules ORDER BY name;

-- name: change_schedule
UPDATE runifold_schedules
SET definition_name = :definition_name, definition_version = :definition_version, cron = :cron,
    every_s = :every_s, timezone = :timezone, input = :input, changed_at = :now
WHERE name = :name;

-- name: redeclare_schedule
-- declared_at is the last declaration: what schedules checks against live workers' starts.
UPDATE runifold_schedules SET declared_at = :now WHERE name = :name;

-- name: remove_schedule
-- Its tick tasks are not touched: they are tasks like any other.
DELETE FROM runifold_schedules WHERE name = :name RETURNING *;

-- name: record_tick
UPDATE runifold_schedules SET last_tick = :tick WHERE name = :name;

-- name: pause_schedule
UPDATE runifold_schedules SET paused_at = :now, paused_by = :actor, paused_reason = :reason
WHERE name = :name
RETURNING *;

-- name: resume_schedule
-- Active from now once resumed: the ticks that fell while paused are not made.
UPDATE runifold_schedules
SET active_since = CASE WHEN paused_at IS NULL THEN active_since ELSE :now END,
    paused_at = NULL, paused_by = NULL, paused_reason = NULL
WHERE name = :name
RETURNING *;

-- name: insert_schedule_event
INSERT INTO runifold_schedule_events (name, at, kind, actor, reason, detail)
VALUES (:name, :now, :kind, :actor, :reason, :detail);

-- name: schedule_events
SELECT name, at, kind, actor, reason, detail FROM runifold_schedule_events
WHERE name = :name ORDER BY id;

-- name: task_page_filters
-- The task filters of list_tasks, and of list_tasks_page(_newest) applied to its window.
(:state IS NULL OR state = :state) AND (:tenant IS NULL OR tenant = :tenant)
    AND (:definition IS NULL OR definition_name = :definition)
    AND (:parent IS NULL OR parent_id = :parent)
    AND (:queue IS NULL OR queue = :queue)
    AND (:attribute_count = 0 OR task_id IN (
        SELECT a.task_id FROM json_each(:attributes) f
        JOIN runifold_task_attributes a ON a.key = json_extract(f.value, '$.key')
            AND a.kind = json_extract(f.value, '$.kind') AND a.value = json_extract(f.value, '$.value')
        GROUP BY a.task_id HAVING count(*) = :attribute_count))

-- name: list_tasks_page
-- The dashboard's task list (sql_reads.list_tasks_page), oldest first: of the next
-- :scan tasks after the cursor (created_at, task_id), read from index
-- runifold_tasks_created, those matching the filters. A page reads at most :scan rows,
-- however deep it is and however few tasks match.
SELECT *
FROM (
    SELECT * FROM runifold_tasks
    WHERE (created_at, task_id) > (:after_at, :after_id)
    ORDER BY created_at, task_id
    LIMIT :scan
) AS w
WHERE {query:task_page_filters}
ORDER BY created_at, task_id
LIMIT :limit;

-- name: list_tasks_page_newest
-- As list_tasks_page, newest first: the window is the :scan tasks before the cursor,
-- read backwards from the same index.
SELECT *
FROM (
    SELECT * FROM runifold_tasks
    WHERE (created_at, task_id) < (:after_at, :after_id)
    ORDER BY created_at DESC, task_id DESC
    LIMIT :scan
) AS w
WHERE {query:task_page_filters}
ORDER BY created_at DESC, task_id DESC
LIMIT :limit;

-- name: task_window_end
-- The last of the next :scan tasks after the cursor and the task after it (none or one
-- row when the window reaches the newest task): where a page whose window held too few
-- matches lets the next one go on (index only).
SELECT created_at, task_id FROM runifold_tasks
WHERE (created_at, task_id) > (:after_at, :after_id)
ORDER BY created_at, task_id
LIMIT 2 OFFSET :scan - 1;

-- name: task_window_end_newest
-- As task_window_end, walking newest first.
SELECT created_at, task_id FROM runifold_tasks
WHERE (created_at, task_id) < (:after_at, :after_id)
ORDER BY created_at DESC, task_id DESC
LIMIT 2 OFFSET :scan - 1;

-- name: finished_per_interval
-- Tasks that finished since :since, per interval of :interval (microseconds) counted from
-- it, by how they ended (index runifold_events_ended): the overview's throughput.
SELECT (at - :since) / :interval AS bucket, kind, COUNT(*) AS tasks
FROM runifold_events
WHERE kind IN ('completed', 'failed', 'cancelled') AND at >= :since
GROUP BY bucket, kind;

-- name: insert_login
-- An operator's login (store.start_login), by the digest of its id.
INSERT INTO runifold_logins (digest, started_at, expires_at) VALUES (:digest, {now}, {now} + :lifetime);

-- name: live_login
SELECT 1 AS live FROM runifold_logins WHERE digest = :digest AND expires_at > {now};

-- name: end_login
DELETE FROM runifold_logins WHERE digest = :digest;

-- Repairs (sql_repairs.py): fork, resuming a cancelled task, retry and cancel by filter.

-- name: fork_head
-- The forked task's checkpoint: the original's journal up to the fork point, and the
-- fingerprint it was written by, so only a worker with those steps claims it.
UPDATE runifold_tasks SET head = :head, fingerprint = :fingerprint WHERE task_id = :task_id AND head IS NULL;

-- name: fork_journal_entry
INSERT INTO runifold_journal (task_id, journal, position, entry) VALUES (:task_id, :journal, :position, :entry);

-- name: resume_cancelled
UPDATE runifold_tasks
SET state = 'queued', outcome = NULL, reason = NULL, cancel_requested = NULL, claims_since_progress = 0,
    paused = NULL, ready_at = :now, updated_at = :now
WHERE task_id = :task_id AND state = 'cancelled'
RETURNING :now AS at;

-- name: match_filters
-- The filters of retry and cancel by filter (TaskSelector); each NULL matches any task.
(:definition IS NULL OR definition_name = :definition)
    AND (:version IS NULL OR definition_version = :version)
    AND (:state IS NULL OR state = :state)
    AND (:outcome IS NULL OR outcome = :outcome)
    AND (:reason_text IS NULL OR instr(reason, :reason_text) > 0)
    AND (:tenant IS NULL OR tenant = :tenant)
    AND (:queue IS NULL OR queue = :queue)
    AND (:since IS NULL OR updated_at >= :since)
    AND (:until IS NULL OR updated_at < :until)

-- name: select_matching
SELECT task_id, created_at FROM runifold_tasks
WHERE {query:match_filters}
    AND (:after_at IS NULL OR created_at > :after_at OR (created_at = :after_at AND task_id > :after_id))
ORDER BY created_at, task_id
LIMIT :limit;

-- name: count_matching
SELECT COUNT(*) AS tasks FROM runifold_tasks WHERE {query:match_filters};

-- name: upgrade_task
-- Move an unleased task to another version of its workflow: the head's definition and
-- the fingerprint are the new version's; only if nothing changed it since it was read.
UPDATE runifold_tasks
SET definition_version = :version, head = :head, fingerprint = :fingerprint, updated_at = :now
WHERE task_id = :task_id AND revision = :revision AND definition_version = :from_version
    AND state IN ('queued', 'waiting')
RETURNING :now AS at;

-- name: set_task_attribute
-- ctx.set_attributes, inside the fenced checkpoint commit that carries it (last write wins).
INSERT INTO runifold_task_attributes (task_id, key, kind, value, set_at)
VALUES (:task_id, :key, :kind, :value, :now)
ON CONFLICT (task_id, key) DO UPDATE
SET kind = excluded.kind, value = excluded.value, set_at = excluded.set_at;

-- name: task_attributes
SELECT key, kind, value FROM runifold_task_attributes WHERE task_id = :task_id ORDER BY key;

-- name: create_schedule
-- store.create_schedule: a schedule created at run time, active from now; none if the name
-- is taken (declared by a registry, or created before).
INSERT INTO runifold_schedules (
    name, definition_name, definition_version, cron, every_s, timezone, input, queue, origin,
    active_since, declared_at, changed_at
) VALUES (
    :name, :definition_name, :definition_version, :cron, :every_s, :timezone, :input, :queue, 'created',
    :now, :now, :now
)
ON CONFLICT (name) DO NOTHING
RETURNING *;

-- name: delete_created_schedule
-- store.delete_schedule: only a schedule created at run time (a registry would store a
-- declared one again). Its tick tasks are not touched.
DELETE FROM runifold_schedules WHERE name = :name AND origin = 'created' RETURNING *;

-- name: created_schedules
SELECT * FROM runifold_schedules WHERE origin = 'created' ORDER BY name;

-- name: append_stream
-- ctx.write_stream, inside the fenced checkpoint commit that carries it: the next position
-- of the task's stream key, unless this writer's seq-th write of the run is there already
-- (a replay, or a step's re-run, writing it again).
INSERT INTO runifold_task_streams (task_id, key, position, run, writer, seq, value, written_at)
SELECT :task_id, :key, COALESCE(MAX(position), 0) + 1, :run, :writer, :seq, :value, :now
FROM runifold_task_streams WHERE task_id = :task_id AND key = :key
ON CONFLICT (task_id, key, run, writer, seq) DO NOTHING;

-- name: read_stream
SELECT position, value FROM runifold_task_streams
WHERE task_id = :task_id AND key = :key AND position > :after
ORDER BY position
LIMIT :limit;

-- name: stream_fence
-- A step body's stream write (StepContext.write_stream): only while its lease holds.
SELECT 1 AS held FROM runifold_tasks
WHERE task_id = :task_id AND fencing_token = :token AND state = 'leased' AND lease_expires > {now};

-- name: lock_flow_key
-- An enqueue with a dedup or debounce key: the caller's BEGIN IMMEDIATE already orders
-- it against every other writer.
SELECT 1 AS locked;

-- name: dedup_within
-- The newest task of a dedup key created within the window (index runifold_tasks_dedup).
SELECT task_id FROM runifold_tasks
WHERE dedup_key = :dedup_key AND created_at > :now - :window
ORDER BY created_at DESC LIMIT 1;

-- name: singleton_unfinished
-- A singleton key's unfinished task, unless a cancel is already on its way to it.
SELECT task_id FROM runifold_tasks
WHERE dedup_key = :dedup_key AND state IN ('queued', 'waiting', 'leased') AND cancel_requested IS NULL
ORDER BY created_at DESC LIMIT 1;

-- name: debounce_fold
-- A debounced enqueue: the key's queued task that never ran a step takes the new input
-- and is due a window after now (never after its debounce_until). A claim that leased it
-- first leaves nothing to fold into, and a new task is enqueued: no input is lost.
UPDATE runifold_tasks
SET input = :input, ready_at = MIN(:now + :debounce, COALESCE(debounce_until, :now + :debounce)),
    updated_at = :now
WHERE debounce_key = :debounce_key AND state = 'queued' AND head IS NULL
    AND definition_name = :definition_name AND definition_version = :definition_version
    AND tenant = :tenant AND paused IS NULL
RETURNING task_id, ready_at, :now AS at;

-- name: set_flow_limit
INSERT INTO runifold_flow_limits (scope, target, max_running, rate_count, rate_period_us, set_at)
VALUES (:scope, :target, :max_running, :rate_count, :rate_period, {now})
ON CONFLICT (scope, target) DO UPDATE SET max_running = excluded.max_running,
    rate_count = excluded.rate_count, rate_period_us = excluded.rate_period_us, set_at = excluded.set_at;

-- name: remove_flow_limit
DELETE FROM runifold_flow_limits WHERE scope = :scope AND target = :target RETURNING scope;

-- name: flow_limits
SELECT scope, target, max_running, rate_count, rate_period_us AS rate_period FROM runifold_flow_limits
ORDER BY scope, target;

-- name: record_flow_claim
-- Numbered one past the group's last claim, and never stamped before it (a store clock set
-- back), so the numbers keep the claims' order (flow_window_claims).
INSERT INTO runifold_flow_claims (scope, name, at, seq)
SELECT :scope, :name, MAX(:now, COALESCE(last.at, :now)), COALESCE(last.seq, 0) + 1
FROM (SELECT 1) LEFT JOIN (
    SELECT at, seq FROM runifold_flow_claims WHERE scope = :scope AND name = :name
    ORDER BY at DESC, seq DESC LIMIT 1
) last
RETURNING seq;

-- name: prune_flow_claims
-- Claims older than every rate's period count toward none. Dropped when a group's claim
-- number is a multiple of 64, not at every claim: on PostgreSQL a delete at every claim
-- walked the rows the previous ones had deleted, not yet vacuumed, and halved the claims/s
-- of a rated queue. So a group keeps at most 64 claims past its window.
DELETE FROM runifold_flow_claims
WHERE at <= :now - COALESCE((SELECT MAX(rate_period_us) FROM runifold_flow_limits), 0);

-- name: flow_limited_groups
-- Part of flow_group_stats and flow_groups_of_task: each of their groups (scope, name)
-- with the limit that applies to it.
limited AS (
    SELECT g.scope, g.name, l.target, l.max_running, l.rate_count, l.rate_period_us
    FROM groups g JOIN limits l ON {query:flow_group_limit}
)

-- name: flow_group_counts
-- Part of flow_group_stats and flow_groups_of_task: group g's running tasks, its claims
-- within the window of its rate (g.rate_period_us) and the oldest of them.
    (SELECT COUNT(*) FROM runifold_tasks r WHERE r.state = 'leased' AND r.lease_expires > {now}
        AND CASE g.scope WHEN 'key' THEN r.concurrency_key WHEN 'definition' THEN r.definition_name
            ELSE r.queue END = g.name) AS running,
    (SELECT COUNT(*) FROM runifold_flow_claims c WHERE c.scope = g.scope AND c.name = g.name
        AND c.at > {now} - COALESCE(g.rate_period_us, 0)) AS claimed_in_window,
    (SELECT MIN(c.at) FROM runifold_flow_claims c WHERE c.scope = g.scope AND c.name = g.name
        AND c.at > {now} - COALESCE(g.rate_period_us, 0)) AS oldest_claim_at

-- name: flow_group_stats
-- Every group a limit applies to that has tasks running, ready or claimed within its
-- window: its running count, its claims in the window, its ready tasks, the oldest
-- claim in the window (ops: stats, the dashboard, metrics).
WITH limits AS (SELECT scope, target, max_running, rate_count, rate_period_us FROM runifold_flow_limits),
groups AS (
    SELECT DISTINCT 'key' AS scope, concurrency_key AS name FROM runifold_tasks
        WHERE concurrency_key IS NOT NULL AND state IN ('queued', 'waiting', 'leased') AND ready_at IS NOT NULL
            AND EXISTS (SELECT 1 FROM limits WHERE scope = 'key')
    UNION SELECT scope, name FROM runifold_flow_claims
    UNION SELECT scope, target FROM limits WHERE scope <> 'key'
),
{query:flow_limited_groups}
SELECT g.scope, g.name, g.target, g.max_running, g.rate_count, g.rate_period_us AS rate_period, {now} AS at,
    {query:flow_group_counts},
    (SELECT COUNT(*) FROM runifold_tasks w WHERE w.state IN ('queued', 'waiting') AND w.ready_at <= {now}
        AND w.paused IS NULL
        AND CASE g.scope WHEN 'key' THEN w.concurrency_key WHEN 'definition' THEN w.definition_name
            ELSE w.queue END = g.name) AS waiting
FROM limited g
ORDER BY g.scope, g.name;

-- name: age_priorities
-- Priority aging (store.age_priorities): a ready task gains one priority level for each
-- :waited it has been ready, up to :up_to (never lowered; counted from its priority at
-- enqueue, kept in base_priority), so low priority work is not starved for ever.
UPDATE runifold_tasks
SET base_priority = COALESCE(base_priority, priority),
    priority = MAX(priority, MIN(:up_to, COALESCE(base_priority, priority) + (:now - ready_at) / :waited))
WHERE state IN ('queued', 'waiting') AND ready_at IS NOT NULL AND ready_at <= :now - :waited
    AND paused IS NULL AND priority < :up_to
    AND MIN(:up_to, COALESCE(base_priority, priority) + (:now - ready_at) / :waited) > priority
RETURNING task_id;

-- name: flow_groups_of_task
-- flow_group_stats for the groups of one task (its key, definition and queue) that a
-- limit applies to, without the waiting count: why a ready task is held (explain_reasons).
WITH limits AS (SELECT scope, target, max_running, rate_count, rate_period_us FROM runifold_flow_limits),
groups AS (
    SELECT 'key' AS scope, :concurrency_key AS name WHERE :concurrency_key IS NOT NULL
    UNION ALL SELECT 'definition', :definition_name
    UNION ALL SELECT 'queue', :queue
),
{query:flow_limited_groups}
SELECT g.scope, g.name, g.target, g.max_running, g.rate_count, g.rate_period_us AS rate_period, {now} AS at,
    {query:flow_group_counts},
    0 AS waiting
FROM limited g;
