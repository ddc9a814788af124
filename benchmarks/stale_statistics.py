"""PostgreSQL claims on statistics taken before a bulk enqueue: a new store whose task
table was never analyzed (autovacuum off for it, so it stays that way) and the same
store analyzed, each with N tasks enqueued through the store (N=15,000; 5,000 with
``--quick``). Claims alternate between the two in rounds (``scale.claim_rate``); the
ratio is the stale store's claims/s to the analyzed one's. Before schema 18 the planner
took the idle wait's due-time index for the claim on the stale store and read the
route's whole backlog at every claim.
``python benchmarks/stale_statistics.py [--quick]``.
"""

from __future__ import annotations

from contextlib import ExitStack

import psycopg
from common import (
    Row,
    arg_parser,
    enqueue_workflows,
    fresh_store,
    print_table,
    progress,
    rate,
    retry_on_restart,
)
from scale import claim_rate

from runifold_sync import open_store


@retry_on_restart
def measure(queued: int) -> dict[str, float]:
    with ExitStack() as stack:
        stores = {}
        for config in ("stale", "analyzed"):
            url = stack.enter_context(fresh_store("postgres"))
            store = open_store(url)
            stack.callback(store.close)
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("ALTER TABLE runifold_tasks SET (autovacuum_enabled = off)")
            progress(f"stale statistics: {config}: enqueueing {queued:,} tasks")
            enqueue_workflows(store, queued, 1, delay=None)
            if config == "analyzed":
                with psycopg.connect(url, autocommit=True) as admin:
                    admin.execute("ANALYZE runifold_tasks")
            stores[config] = store
        progress("stale statistics: claiming in both databases")
        return claim_rate(stores, min(queued, 3_000))


def run(quick: bool) -> list[Row]:
    queued = 5_000 if quick else 15_000
    rates = measure(queued)
    ratio = rates["stale"] / rates["analyzed"]
    return [
        Row(f"PostgreSQL: claims/s, {queued:,} queued, analyzed", rate(rates["analyzed"]), "baseline"),
        Row(
            f"PostgreSQL: claims/s, {queued:,} queued on a table never analyzed",
            rate(rates["stale"]),
            f"{ratio:.2f}x analyzed",
            ">= 0.80x analyzed",
            ratio >= 0.8,
        ),
    ]


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="5,000 queued tasks")
    args = parser.parse_args()
    print_table("Claims on statistics taken before a bulk enqueue", run(args.quick))


if __name__ == "__main__":
    main()
