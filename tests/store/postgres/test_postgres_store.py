"""What only the PostgreSQL store has: JSONB columns, NOTIFY, the claim's index, the
pool's arguments and its errors."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql

from runifold_sync import LeaseDuration, WorkerId, WorkflowTask
from runifold_sync.errors import InvalidArgument, StoreNotWritable, StoreUnavailable
from runifold_sync.model.codec import to_json
from runifold_sync.model.flow import FlowLimit, Rate
from runifold_sync.postgres import PostgresWorkflowStore
from runifold_sync.store.postgres.statements import Q, claim_statement, route_params
from runifold_sync.store.records import Routes
from tests.support.pgplans import numbered, plan_nodes

LEASE = LeaseDuration(timedelta(seconds=30))
W1 = WorkerId.parse("worker-1")


def task(task_id: str = "t1", value: Any = None) -> WorkflowTask:
    return WorkflowTask.new("orders", 1, value or {"order_id": task_id}, checkpoint_id=task_id)


def test_payloads_are_jsonb_an_operator_can_query(pg: PostgresWorkflowStore, postgres_url: str) -> None:
    pg.enqueue(task(value={"order_id": "ord_42", "lines": [{"sku": "a"}]}))
    lease = pg.claim(W1, LEASE)[0].lease
    pg.complete(lease, 0, to_json({"phase": "completed"}), to_json({"charge": "ch_1"}))
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT input->>'order_id', input->'lines'->0->>'sku', head->>'phase', result->>'charge', "
            "pg_typeof(input)::text FROM runifold_tasks"
        ).fetchone()
        detail = conn.execute(
            "SELECT detail->>'definition' FROM runifold_events WHERE kind = 'enqueued'"
        ).fetchone()
    assert row == ("ord_42", "a", "completed", "ch_1", "jsonb")
    assert detail == ("orders",)


def test_autovacuum_visits_the_task_table_by_its_churn_not_its_size(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    """Migration 26: finished tasks are kept, so the default (a fifth of the rows dead)
    would let dead row versions grow with every task ever stored."""
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT reloptions FROM pg_class WHERE oid = 'runifold_tasks'::regclass"
        ).fetchone()
    assert row is not None
    assert set(row[0]) == {
        "autovacuum_vacuum_scale_factor=0.01",
        "autovacuum_vacuum_threshold=1000",
        "autovacuum_analyze_scale_factor=0.02",
    }


def test_integral_floats_from_1e16_come_back_as_equal_integers(pg: PostgresWorkflowStore) -> None:
    """The one documented JSONB difference: numeric cannot tell 1e20 from 10**20. The
    input keeps its exact text (input_text), so only checkpoints and results see it."""
    pg.enqueue(task(value={"big": 1e20}))
    claimed = pg.claim(W1, LEASE)[0]
    assert claimed.input_json == '{"big":1e+20}'
    pg.complete(claimed.lease, 0, to_json({"big": 1e20}), to_json(1e20))
    record = pg.get_task("t1")
    assert (record.checkpoint_json, record.result_json) == (
        '{"big":100000000000000000000}',
        "100000000000000000000",
    )
    assert record.result == 1e20


@pytest.mark.parametrize("text", ['{"s":"a\\u0000b"}', '{"s":"\\\\\\u0000"}'])
def test_a_json_payload_with_a_nul_character_is_refused_as_invalid(
    pg: PostgresWorkflowStore, text: str
) -> None:
    pg.enqueue(task())
    lease = pg.claim(W1, LEASE)[0].lease
    with pytest.raises(InvalidArgument, match="U\\+0000"):
        pg.commit_checkpoint(lease, 0, text)
    assert pg.commit_checkpoint(lease, 0, '{"s":"\\\\u0000"}').revision == 1  # an escaped backslash is fine


def test_a_reason_with_a_nul_character_is_stored_with_a_replacement_character(
    pg: PostgresWorkflowStore,
) -> None:
    pg.enqueue(task())
    lease = pg.claim(W1, LEASE)[0].lease
    pg.fail(lease, 0, None, reason="step raised ValueError: bad\x00byte")
    assert pg.get_task("t1").reason == "step raised ValueError: bad\ufffdbyte"


def listen(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("LISTEN runifold_tasks")
    return conn


def notified(conn: psycopg.Connection[Any]) -> bool:
    return any(n.channel == "runifold_tasks" for n in conn.notifies(timeout=0.5, stop_after=1))


def test_transitions_that_make_work_claimable_notify_idle_workers(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    with listen(postgres_url) as conn:
        pg.enqueue(task("a"))
        assert notified(conn), "enqueue"
        assert not pg.enqueue(task("a")).created
        assert not notified(conn), "an idempotent enqueue creates no work"
        lease = pg.claim(W1, LEASE)[0].lease
        assert not notified(conn), "claim"
        pg.retry(lease, 0, to_json({}), delay=timedelta(0), reason="again")
        assert notified(conn), "retry"
        lease = pg.claim(W1, LEASE)[0].lease
        pg.release(lease, delay=timedelta(0), reason="back")
        assert notified(conn), "release"
        lease = pg.claim(W1, LEASE)[0].lease
        pg.suspend(lease, 1, to_json({}), wake_at=pg.now() + timedelta(hours=1), reason="timer")
        assert notified(conn), "suspend with a timer"
        pg.set_clock_offset(timedelta(hours=2))
        lease = pg.claim(W1, LEASE)[0].lease
        pg.fail(lease, 2, None, reason="ambiguous", ambiguous_effect="a/charge#1")
        assert not notified(conn), "fail"
        pg.resolve_effect("a", "a/charge#1", applied=False, result_json=None, actor="ops", reason="checked")
        assert notified(conn), "resolve_effect"
        claimed = pg.claim(W1, LEASE)[0]
        pg.fail(claimed.lease, claimed.revision, None, reason="boom")
        assert not notified(conn), "fail"
        pg.requeue("a", actor="ops", reason="fixed upstream")
        assert notified(conn), "requeue"
        claimed = pg.claim(W1, LEASE)[0]
        pg.suspend(claimed.lease, claimed.revision, to_json({}), wake_at=None, reason="wait", signal="go")
        assert not notified(conn), "suspend until a signal, without a timer"
        pg.send_signal("a", "other", 1, signal_id="s1", sender="ops")
        assert not notified(conn), "a signal the task does not wait for"
        pg.send_signal("a", "go", 1, signal_id="s2", sender="ops")
        assert notified(conn), "send_signal waking the waiting task"
        assert pg.claim(W1, LEASE)[0].lease.task_id == "a"


def test_work_that_came_without_a_notify_is_found_when_the_wait_ends(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    """A wait that no NOTIFY wakes (the task below is inserted by raw SQL once the waiter
    has looked for due work and sleeps) still reports the work when its timeout ends:
    idle workers wait in short slices (0.5 s in the supervisor), so a NOTIFY only makes
    the pickup sooner."""
    inserted_at: list[float] = []

    def insert_once_the_waiter_sleeps() -> None:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            deadline = time.monotonic() + 10
            while not conn.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND state = 'idle' "
                "AND query LIKE '%%due_in_s%%' AND pid <> pg_backend_pid()"
            ).fetchall():
                assert time.monotonic() < deadline, "the waiter never looked for due work"
                time.sleep(0.01)
            conn.execute(
                "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
                "input_text, state, ready_at, created_at, updated_at) VALUES ('silent', 'orders', 1, "
                "'default', '{}', '{}', 'queued', clock_timestamp(), clock_timestamp(), clock_timestamp())"
            )
            inserted_at.append(time.monotonic())

    with listen(postgres_url) as conn:
        inserter = threading.Thread(target=insert_once_the_waiter_sleeps)
        started = time.monotonic()
        inserter.start()
        try:
            found = pg.wait_for_work(timedelta(seconds=2.0))
        finally:
            inserter.join()
        elapsed_s = time.monotonic() - started
        assert not notified(conn), "the raw INSERT sent no NOTIFY"
    assert inserted_at and inserted_at[0] - started < 1.9, "inserted too late to test the wait"
    assert found and 1.95 <= elapsed_s < 6, elapsed_s  # woken by nothing: the whole wait
    assert pg.claim(W1, LEASE)[0].lease.task_id == "silent"


FINISHED = 200_000


def _claim_as_production_runs_it(
    pg: PostgresWorkflowStore, limit: int, routes: Routes, *, flowed: bool = True
) -> list[dict[str, Any]]:
    """The nodes of the plan a worker's claim (``routes``, ``limit``; with flow control or
    without, as sent while no limit is set) runs on: its exact text prepared on a store
    connection and executed on its generic plan (EXPLAIN ANALYZE, rolled back), as
    ``claim_in`` runs it."""
    text, names = numbered(claim_statement(limit, routes, flowed=flowed))
    params = {"worker_id": "worker-1", "lease": 30.0}
    arguments = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
    with pg.dialect.pool.connection() as conn, conn.transaction():
        conn.execute(Q["lock_limited_tenants"])  # sets plan_cache_mode = force_generic_plan
        conn.execute(("PREPARE runifold_claim AS " + text).encode())
        explain = sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE runifold_claim ({})")
        [plan] = conn.execute(explain.format(arguments)).fetchall()
        plans = conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'runifold_claim'"
        ).fetchall()
        conn.execute("DEALLOCATE runifold_claim")  # prepared statements outlive a rollback
        raise psycopg.Rollback()  # EXPLAIN ANALYZE ran the UPDATE
    assert plans == [{"generic_plans": 1, "custom_plans": 0}]
    return list(plan_nodes(plan["QUERY PLAN"][0]["Plan"]))


UNSERVED = 10_000
ROUTES = Routes.serving(["default"], [("orders", 1, "fp-a"), ("refunds", 2, "fp-r")])


def test_the_claim_as_production_runs_it_reads_only_its_routes_past_finished_and_unserved_tasks(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    """The statement a worker's ``claim`` sends (its routes and the limit written in its
    text), prepared and run on its generic plan as ``plan_cache_mode =
    force_generic_plan`` makes it, on a store connection, over 200,000 finished tasks and
    10,000 ready ones of a definition and of a queue the worker does not serve."""
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, outcome, created_at, updated_at) "
            "SELECT 'done-' || g, 'orders', 1, 'default', '{}', '{}', 'terminal', 'completed', "
            "clock_timestamp(), clock_timestamp() FROM generate_series(1, %s) g",
            (FINISHED,),
        )
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, ready_at, created_at, updated_at, queue) "
            "SELECT 'unserved-' || g, CASE WHEN g %% 2 = 0 THEN 'billing' ELSE 'orders' END, 1, "
            "'default', '{}', '{}', 'queued', clock_timestamp() - interval '1 hour', "
            "clock_timestamp(), clock_timestamp(), CASE WHEN g %% 2 = 0 THEN 'default' ELSE 'render' END "
            "FROM generate_series(1, %s) g",
            (UNSERVED,),
        )
        admin.execute("ANALYZE runifold_tasks")
    for n in range(5):
        pg.enqueue(task(f"live-{n}"))
    # One of them leased by a worker that vanished: its lease has run out.
    [vanished] = pg.claim(W1, LeaseDuration(timedelta(milliseconds=1)), routes=ROUTES)
    time.sleep(0.01)
    nodes = _claim_as_production_runs_it(pg, 3, ROUTES)
    scans = {
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == "runifold_tasks" and n["Node Type"].endswith("Scan")
    }
    # Candidates from each route's slice of the partial index, locked as they are read;
    # expired leases from the partial index of leased tasks; the lease written by primary
    # key; a tenant's lease count (for a lease limit) from that partial index too. Never
    # a scan of the backlog the worker does not serve.
    # A key's running tasks (for a key's max_running) from a partial index of leased
    # tasks: their own, or (as the statistics have it, with few leased) the leased index.
    key_counts = {scan for scan in scans if scan[1] == "runifold_tasks_leased_key"}
    assert scans - key_counts == {
        ("Index Scan", "runifold_tasks_routed"),
        ("Index Scan", "runifold_tasks_pkey"),
        ("Index Scan", "runifold_tasks_leased"),
        ("Index Only Scan", "runifold_tasks_leased"),
    }
    routed = [n for n in nodes if n.get("Index Name") == "runifold_tasks_routed"]
    assert all(n["Actual Rows"] <= 3 for n in routed)
    # The expired leases are read by their expiry alone, never the leased backlog.
    leased = [
        n for n in nodes if n.get("Index Name") == "runifold_tasks_leased" and n["Node Type"] == "Index Scan"
    ]
    expired = [n for n in leased if "lease_expires <=" in n.get("Index Cond", "")]
    assert expired and all(n["Actual Rows"] <= 1 for n in expired)
    # The leases flow limits count (the running tasks) are read only while a limit exists.
    running = [n for n in leased if "Index Cond" not in n]
    running += [n for n in nodes if n.get("Index Name") == "runifold_tasks_leased_key"]
    assert running and all(n["Actual Loops"] == 0 for n in running)
    # The claim sent while no limit is set reads the same indexes, and no running task.
    unflowed = _claim_as_production_runs_it(pg, 3, ROUTES, flowed=False)
    assert {
        (n["Node Type"], n.get("Index Name"))
        for n in unflowed
        if n.get("Relation Name") == "runifold_tasks" and n["Node Type"].endswith("Scan")
    } == scans - key_counts
    leased = [n for n in unflowed if n.get("Index Name") == "runifold_tasks_leased"]
    assert not [n for n in leased if "Index Cond" not in n]
    assert not [n for n in unflowed if str(n.get("Relation Name", "")).startswith("runifold_flow")]
    [lock] = [
        n
        for n in nodes
        if n["Node Type"] == "LockRows" and n["Plans"][0].get("Index Name") == "runifold_tasks_routed"
    ]
    # Sorted: at most the limit's worth of expired leases and of ready tasks.
    sorts = [n["Actual Rows"] for n in nodes if n["Node Type"] == "Sort"]
    assert all(rows <= 2 * 3 for rows in sorts), sorts
    claimed = pg.claim(W1, LEASE, limit=10, routes=ROUTES)
    assert [c.lease.task_id for c in claimed][:1] == [vanished.lease.task_id] and len(claimed) == 5
    assert len(pg.claim(W1, LEASE, limit=10, routes=ROUTES)) == 0

    # The idle wait's earliest due time: one row per route from the due index.
    due = "EXPLAIN (ANALYZE, FORMAT JSON) " + Q["seconds_until_routed_due"]
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        [(due_plan,)] = admin.execute(due.encode(), route_params(ROUTES)).fetchall()
    nodes = list(plan_nodes(due_plan[0]["Plan"]))
    on_tasks = [n for n in nodes if n.get("Relation Name") == "runifold_tasks"]
    assert {n.get("Index Name") for n in on_tasks} == {"runifold_tasks_routed_due"}
    assert all(n["Actual Rows"] <= 1 for n in on_tasks)
    # Its five are leased: the due backlog it cannot claim does not wake it.
    assert pg.wait_for_work(timedelta(0), ROUTES) is False
    assert pg.wait_for_work(timedelta(0)) is True


@pytest.mark.slow  # enqueues 15,000 tasks
def test_the_claim_reads_its_routes_in_claim_order_on_statistics_taken_before_a_bulk_enqueue(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    """A table never analyzed (a new store) with 15,000 tasks enqueued: the planner, sure
    each route holds one row, once read a route's whole backlog from the idle wait's
    due index and sorted it (17 ms of server CPU a claim). The due index now has a term
    only the idle wait states, so the claim reads runifold_tasks_routed, in claim order."""
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute("ALTER TABLE runifold_tasks SET (autovacuum_enabled = off)")
    for _ in range(15):
        pg.enqueue_many([WorkflowTask.new("bench-flow", 1, 1) for _ in range(1_000)])
    # Both indexes' paths are estimated at one row and the same cost, so which one the
    # planner took turned on the statement's text: these routes reproduced it.
    routes = Routes.serving(["default"], [("bench-flow", 1, "fp-a"), ("refunds", 2, "fp-r")])
    nodes = _claim_as_production_runs_it(pg, 1, routes)
    on_tasks = [n for n in nodes if n.get("Relation Name") == "runifold_tasks"]
    assert "runifold_tasks_routed_due" not in {n.get("Index Name") for n in on_tasks}
    routed = [n for n in on_tasks if n.get("Index Name") == "runifold_tasks_routed"]
    assert routed and all(n["Actual Rows"] <= 1 for n in routed)


def test_a_step_commit_is_a_heap_only_update(pg: PostgresWorkflowStore) -> None:
    """A step commit changes no column any index of the tasks covers (keys and partial
    predicates alike), so PostgreSQL writes it as a heap-only update: no index entry per
    step. An index predicate on the revision made every step commit write every index."""
    pg.enqueue(task("t1"))
    [claimed] = pg.claim(W1, LEASE)
    # The backend's counts not yet sent to the statistics include its earlier
    # transactions: the commit's are the difference.
    counts = (
        "SELECT pg_stat_get_xact_tuples_updated('runifold_tasks'::regclass) AS updated, "
        "pg_stat_get_xact_tuples_hot_updated('runifold_tasks'::regclass) AS heap_only"
    )
    with pg.step_transaction() as tx:
        before = tx.connection.execute(counts).fetchone()
        tx.commit_checkpoint(claimed.lease, claimed.revision, '{"step": 1}')
        after = tx.connection.execute(counts).fetchone()
    assert {key: after[key] - before[key] for key in after} == {"updated": 1, "heap_only": 1}


def test_store_connections_run_without_jit(pg: PostgresWorkflowStore) -> None:
    """A claim estimated above jit_above_cost (10,000 waiting tasks) spent ~50 ms a claim
    compiling; every connection of the pool has JIT off."""
    with pg.dialect.pool.connection() as first, pg.dialect.pool.connection() as second:
        settings = [conn.execute("SHOW jit").fetchone() for conn in (first, second)]
    assert settings == [{"jit": "off"}, {"jit": "off"}]


def test_a_claim_turns_jit_off_for_its_own_transaction_where_the_session_setting_cannot_reach(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    """Behind PgBouncer's transaction pooling the pool's ``SET jit = off`` does not stick,
    and the claim with its flow-control parts is estimated above jit_above_cost: compiling
    it took about 200 ms a claim. The claim's first statement turns JIT off for its own
    transaction, on a connection whose session has it on."""
    with psycopg.connect(postgres_url) as conn:
        conn.execute("SET jit = on")
        conn.execute(Q["lock_limited_tenants"])
        assert conn.execute("SHOW jit").fetchone() == ("off",)
        conn.rollback()
        assert conn.execute("SHOW jit").fetchone() == ("on",)


def test_a_connection_the_server_dropped_while_idle_is_replaced_at_checkout_and_one_dropped_in_use_fails_once(
    postgres_url: str,
) -> None:
    """A terminated backend says so and closes its socket: the pool finds that at
    checkout, with one poll of the socket for a connection used a moment ago (one idle
    for over a second is checked with a round trip), and hands out a fresh connection
    before anything is sent, so the caller never sees the kill. A connection dropped
    while its statement runs fails that call once (outside a lease holder's patience
    nothing is sent again) and is dropped."""
    store = PostgresWorkflowStore.connect(postgres_url, min_size=1, max_size=1)
    try:
        store.enqueue(task("t1"))

        def kill_backends(after_s: float = 0.0) -> None:
            time.sleep(after_s)
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )

        kill_backends()
        time.sleep(1.2)  # idle past the check threshold: checked and replaced at checkout
        assert store.get_task("t1").task_id == "t1"
        kill_backends()  # used a moment ago: its socket says it was dropped
        time.sleep(0.1)  # the server's goodbye reaches the socket
        assert store.get_task("t1").task_id == "t1"
        killer = threading.Thread(target=kill_backends, args=(0.5,))
        killer.start()
        try:
            with pytest.raises(StoreUnavailable, match="AdminShutdown|terminating connection"):
                store.dialect.pool.fetch_one("SELECT pg_sleep(5)", {})
        finally:
            killer.join()
        assert store.get_task("t1").task_id == "t1"  # the broken connection was dropped
    finally:
        store.close()


def test_connect_to_an_unreachable_server_raises_store_unavailable_without_the_password() -> None:
    with pytest.raises(StoreUnavailable) as info:
        PostgresWorkflowStore.connect(
            "postgresql://someone:s3cret@127.0.0.1:1/nowhere", connect_timeout=timedelta(seconds=1)
        )
    assert "nowhere" in str(info.value) and "s3cret" not in str(info.value)


@pytest.mark.parametrize(
    "options",
    [{"min_size": -1}, {"max_size": 0}, {"min_size": 5, "max_size": 2}, {"pool_timeout": timedelta(0)}],
)
def test_connect_refuses_bad_pool_arguments(postgres_url: str, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument):
        PostgresWorkflowStore.connect(postgres_url, **options)


def test_a_read_only_database_refuses_writes_as_not_writable_not_as_an_outage(postgres_url: str) -> None:
    """A read-only server or database (a standby, ``default_transaction_read_only``) is
    :class:`StoreNotWritable`, which workers give up on after a few tries; reads work."""
    PostgresWorkflowStore.connect(postgres_url).close()  # migrated while writable
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        dbname = conn.info.dbname
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET default_transaction_read_only = on").format(sql.Identifier(dbname))
        )
    with pytest.raises(StoreNotWritable, match="ReadOnlySqlTransaction"):
        PostgresWorkflowStore.connect(postgres_url)  # migrating is a write
    store = PostgresWorkflowStore.connect(postgres_url, migrate=False)
    try:
        with pytest.raises(StoreNotWritable, match=f"PostgreSQL database {dbname} .* refused a write"):
            store.enqueue(task())
        assert store.list_tasks() == []
    finally:
        store.close()


def test_a_request_that_waited_for_a_pooled_connection_is_counted_with_its_wait(postgres_url: str) -> None:
    store = PostgresWorkflowStore.connect(postgres_url, min_size=1, max_size=1)
    try:
        store.pool_waits()  # from here on
        holding = threading.Event()

        def hold_the_only_connection() -> None:
            with store.dialect.pool.connection():
                holding.set()
                time.sleep(0.3)

        holder = threading.Thread(target=hold_the_only_connection)
        holder.start()
        holding.wait(5)
        store.enqueue(task())
        holder.join()
        waits = store.pool_waits()
        assert waits.requests >= 2 and waits.waited == 1
        assert 0.2 <= waits.wait_s < 5
        assert store.pool_waits().requests == 0  # taken: the count starts again
    finally:
        store.close()


def test_the_claim_with_flow_limits_reads_the_running_tasks_and_the_rate_window_by_index(
    pg: PostgresWorkflowStore, postgres_url: str
) -> None:
    """With a key limit and a rate set, the claim (as production runs it) over 20,000
    finished tasks and 1,000 ready ones of 1,000 keys reads the leases from the partial
    index of leased tasks (the running tasks only), the rate's claims from
    runifold_flow_claims' indexes, and no backlog."""
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, outcome, created_at, updated_at) "
            "SELECT 'done-' || g, 'orders', 1, 'default', '{}', '{}', 'terminal', 'completed', "
            "clock_timestamp(), clock_timestamp() FROM generate_series(1, 20000) g"
        )
        admin.execute(
            "INSERT INTO runifold_tasks (task_id, definition_name, definition_version, tenant, input, "
            "input_text, state, ready_at, created_at, updated_at, concurrency_key) "
            "SELECT 'ready-' || g, 'orders', 1, 'default', '{}', '{}', 'queued', clock_timestamp(), "
            "clock_timestamp(), clock_timestamp(), 'key-' || g FROM generate_series(1, 1000) g"
        )
        admin.execute("ANALYZE runifold_tasks")
    pg.set_flow_limit(FlowLimit("key", "key-*", max_running=1, rate=Rate(100, timedelta(seconds=1))))
    pg.claim(W1, LEASE, limit=5, routes=ROUTES)  # some running, some claims in the window
    nodes = _claim_as_production_runs_it(pg, 3, ROUTES)
    scans = {
        (n["Node Type"], n.get("Relation Name"), n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") in ("runifold_tasks", "runifold_flow_claims")
        and n["Node Type"].endswith("Scan")
    }
    assert not [scan for scan in scans if scan[0] == "Seq Scan"], scans
    assert {name for _, relation, name in scans if relation == "runifold_tasks"} <= {
        "runifold_tasks_routed",
        "runifold_tasks_pkey",
        "runifold_tasks_leased",
    }, scans
    tasks = [n for n in nodes if n.get("Relation Name") == "runifold_tasks"]
    assert all(n["Actual Rows"] <= 20 for n in tasks), [
        (n.get("Index Name"), n["Actual Rows"]) for n in tasks
    ]
    assert len(pg.claim(W1, LEASE, limit=10, routes=ROUTES)) == 10
