"""Both dialects name the same operations, so a query added to one is not forgotten in
the other; the few differences are listed here with the reason for each."""

from __future__ import annotations

import re

import pytest

from runifold_sync.store.queries import load_migrations, load_queries

# SQLite claims in two statements under BEGIN IMMEDIATE (it needs each row's previous
# state for the history, and SQLite's RETURNING cannot read the UPDATE's FROM tables).
# Marking the claimed tenants served is a third statement there.
# Journal rows are written there one statement each after the fenced UPDATE; PostgreSQL
# writes them in CTEs of the fenced statement itself (pgstatements.fenced_statement).
# A prune's batch is deleted there one table a statement (SqliteDialect.prune_queries);
# PostgreSQL deletes it in one statement of CTEs (prune_rows).
SQLITE_ONLY = {
    "claimable_admitted_tenants",
    "claimable_in_turns",
    "claimable_tasks",
    "claimable_routed_tasks",
    "lease_task",
    "mark_tenant_served",
    "write_journal_entry",
    "drop_journal_entry",
    "prune_events",
    "prune_journal",
    "prune_signals",
    "prune_resolutions",
    "prune_task_events",
    "prune_task_attributes",
    "prune_task_streams",
    "prune_tasks",
    # Flow limits as parts of the claim (as claim_flow*), and the rate's claims written a
    # statement each (PostgreSQL writes them in CTEs of its claim).
    "claimable_flow",
    "claimable_flow_open",
    "claimable_flow_admitted",
    "record_flow_claim",
    "prune_flow_claims",
    # Whether a claim needs its flow parts, asked first under BEGIN IMMEDIATE (PostgreSQL's
    # lock_limited_tenants answers it), and the claims without them.
    "flow_limits_set",
    "claimable_in_turns@unflowed",
    "claimable_tasks@unflowed",
    "claimable_routed_tasks@unflowed",
    # A bulk enqueue's events, a statement after its tasks (PostgreSQL writes them in a
    # CTE of insert_tasks_bulk).
    "insert_enqueued_events",
}
# PostgreSQL claims in one statement (a FOR UPDATE SKIP LOCKED CTE feeding the UPDATE),
# after locking the tenants that have a lease limit (lock_limited_tenants), and wakes
# idle workers with LISTEN/NOTIFY, which SQLite does not have. Under READ
# COMMITTED a suspend must look again for a signal delivered while it waited for the
# row lock (wake_if_signal_pending); SQLite's BEGIN IMMEDIATE serializes the two.
# PostgreSQL names a task row's columns to read its JSON ones as text (task_columns);
# SQLite stores them as text and selects *.
POSTGRES_ONLY = {
    "task_columns",
    "claim_admitted_tenants",
    "claim_lease_chosen",
    "claim_tasks",
    "claim_routed_tasks",
    "claim_flow",
    "claim_flow_open",
    "claim_flow_candidates",
    "claim_flow_counted",
    "claim_lease_chosen@unflowed",
    "claim_tasks@unflowed",
    "claim_routed_tasks@unflowed",
    "lock_limited_tenants",
    "notify_work",
    "listen_work",
    "unlisten_work",
    "wake_if_signal_pending",
    "prune_rows",
    "await_result",  # a waiter's mark: only PostgreSQL's task ends are notified
    "complete_batch",  # SQLite completes a batch a statement a task, in one transaction
    "use_generic_plans",  # complete_batch's plan (SQLite plans nothing worth keeping)
    # Wake slots of a notification (postgres/wait.py): SQLite's idle workers poll.
    "take_wake_slot",
    "release_wake_slots",
}


def test_both_dialects_define_the_same_query_names_apart_from_the_listed_exceptions() -> None:
    sqlite = set(load_queries("sqlite", "NOW"))
    postgres = set(load_queries("postgres", "NOW"))
    assert SQLITE_ONLY <= sqlite and not SQLITE_ONLY & postgres
    assert POSTGRES_ONLY <= postgres and not POSTGRES_ONLY & sqlite
    assert sqlite - SQLITE_ONLY == postgres - POSTGRES_ONLY


CLAIMS = {
    "sqlite": ["claimable_tasks", "claimable_routed_tasks"],
    "postgres": ["claim_tasks", "claim_routed_tasks"],
}


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_a_claims_unflowed_variant_is_the_claim_without_its_flow_parts(dialect: str) -> None:
    """A part's ``@unflowed`` text replaces it in every query that includes it, however
    deep: the variant reads no flow table, and the claim itself reads them."""
    queries = load_queries(dialect, "NOW")
    for name in CLAIMS[dialect]:
        assert "runifold_flow_limits" in queries[name] and "flow_closed" in queries[name]
        unflowed = queries[name + "@unflowed"]
        assert "runifold_flow" not in unflowed and "flow_closed" not in unflowed and "limits" not in unflowed
        assert "key_turn" in unflowed  # each key's first task still before its second


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_every_query_is_non_empty_and_uses_the_store_time_token_not_a_session_clock(dialect: str) -> None:
    for name, sql in load_queries(dialect, "{now}").items():
        assert sql.strip(), name
        assert "now()" not in sql.lower(), f"{dialect}.{name} reads now(), frozen at transaction start"
        assert "current_timestamp" not in sql.lower(), f"{dialect}.{name} reads CURRENT_TIMESTAMP"


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_every_fenced_write_checks_token_state_and_expiry(dialect: str) -> None:
    queries = load_queries(dialect, "NOW")
    for name in ("heartbeat", "commit_checkpoint", "suspend", "retry", "release", "complete", "fail"):
        sql = re.sub(r"\s+", " ", queries[name])
        assert "fencing_token = " in sql, name
        assert "state = 'leased'" in sql, name
        assert "lease_expires > " in sql, name


@pytest.mark.parametrize(
    ("dialect", "claims", "shared"),
    [
        (
            "sqlite",
            ("claimable_tasks", "claimable_routed_tasks"),
            ("claimable_admitted_tenants", "claimable_in_turns"),
        ),
        ("postgres", ("claim_tasks", "claim_routed_tasks"), ("claim_admitted_tenants", "claim_lease_chosen")),
    ],
)
def test_both_claims_include_the_parts_they_share_written_once(
    dialect: str, claims: tuple[str, str], shared: tuple[str, str]
) -> None:
    queries = load_queries(dialect, "NOW")
    for claim in claims:
        assert "{query:" not in queries[claim], claim
        for part in shared:
            assert queries[part] in queries[claim], (claim, part)


def test_a_common_query_is_loaded_for_both_dialects_as_written() -> None:
    sqlite, postgres = load_queries("sqlite", "NOW"), load_queries("postgres", "NOW")
    assert sqlite["routed_backlog"] == postgres["routed_backlog"]
    assert "GROUP BY queue" in sqlite["routed_backlog"]


def test_a_versions_common_migration_part_runs_after_each_dialects_own() -> None:
    for dialect in ("sqlite", "postgres"):
        script = dict(load_migrations(dialect))[16]
        assert script.index("ADD COLUMN queue ") < script.index("CREATE INDEX runifold_tasks_routed ON"), (
            dialect
        )


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_migrations_are_numbered_from_one_without_gaps(dialect: str) -> None:
    versions = [version for version, _ in load_migrations(dialect)]
    assert versions == list(range(1, len(versions) + 1))


def test_both_dialects_have_the_same_migration_versions() -> None:
    assert [v for v, _ in load_migrations("sqlite")] == [v for v, _ in load_migrations("postgres")]


def test_each_dialects_prune_queries_are_its_own_named_queries_the_task_rows_last() -> None:
    from runifold_sync.store.postgres.store import PostgresDialect
    from runifold_sync.store.sqlite.store import SqliteDialect

    for dialect, queries in (
        ("sqlite", SqliteDialect.prune_queries),
        ("postgres", PostgresDialect.prune_queries),
    ):
        named = load_queries(dialect, "NOW")
        assert set(queries) <= set(named), dialect
        last = re.sub(r"\s+", " ", named[queries[-1]])
        assert last.rindex("DELETE FROM") == last.index("DELETE FROM runifold_tasks WHERE"), dialect
