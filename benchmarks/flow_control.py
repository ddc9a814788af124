"""Claims per second with flow limits against none, in the same run: two fresh stores per
backend with the same backlog (1,000 concurrency keys, 3 ready tasks each), one with a
limit of 2 running per key (``key-*``) and a rate on the queue set high enough never to
hold (so its window is counted on every claim), the other with no limit. A claimer
claims one task at a time and keeps 50 leases open (completing the oldest beyond that),
so every claim counts the keys' running tasks and some keys are full. Claims are
a worker's: with its routes. Rounds alternate
between the two stores (the best round of each counts: other load on the machine only
ever slows a round down); only the time inside ``claim`` is counted. The ratio is the
limited store's claims/s to the unlimited one's (target 0.8x).
``python benchmarks/flow_control.py [--quick] [--backend sqlite|postgres|both]``.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import ExitStack
from datetime import timedelta

from common import Row, arg_parser, fresh_store, print_table, progress, rate, retry_on_restart

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask, open_store
from runifold_sync.model.codec import to_json
from runifold_sync.model.flow import FlowLimit, Rate
from runifold_sync.store.records import Lease, Routes

KEYS = 1_000
PER_KEY = 3
HELD = 50
# A worker's routes, as every worker claims (the claim reads each route's slice of its
# index in claim order).
ROUTES = Routes.serving(["default"], [("bench-flow", 1, "bench-fingerprint")])
ROUNDS = 3


def fill(store: WorkflowStore) -> None:
    tasks = [
        WorkflowTask.new("bench-flow", 1, n, concurrency_key=f"key-{n % KEYS}") for n in range(KEYS * PER_KEY)
    ]
    for start in range(0, len(tasks), 500):
        store.enqueue_many(tasks[start : start + 500])


def claim_round(store: WorkflowStore, held: deque[tuple[Lease, int]], claims: int) -> float:
    """Claims per second over ``claims`` claims, counting only the time inside claim."""
    worker, lease = WorkerId.parse("flow-bench"), LeaseDuration(timedelta(minutes=10))
    spent = 0.0
    for _ in range(claims):
        started = time.perf_counter()
        batch = store.claim(worker, lease, limit=1, routes=ROUTES)
        spent += time.perf_counter() - started
        if len(batch) != 1:
            raise RuntimeError("a claim found no ready task")
        held.append((batch[0].lease, batch[0].revision))
        while len(held) > HELD:
            done, revision = held.popleft()
            store.complete(done, revision, to_json({}), to_json(None))
    return claims / spent


@retry_on_restart
def measure(kind: str, claims_per_round: int) -> dict[str, float]:
    with ExitStack() as stack:
        stores: dict[str, WorkflowStore] = {}
        for config in ("none", "limits"):
            url = stack.enter_context(fresh_store(kind))
            store = open_store(url)
            stack.callback(store.close)
            progress(f"flow control: {kind}, {config}: enqueueing {KEYS * PER_KEY:,} tasks")
            fill(store)
            if config == "limits":
                store.set_flow_limit(FlowLimit("key", "key-*", max_running=2))
                store.set_flow_limit(
                    FlowLimit("queue", "default", rate=Rate(1_000_000, timedelta(seconds=1)))
                )
            stores[config] = store
        held: dict[str, deque[tuple[Lease, int]]] = {name: deque() for name in stores}
        best = dict.fromkeys(stores, 0.0)
        for _ in range(ROUNDS):
            for name, store in stores.items():
                best[name] = max(best[name], claim_round(store, held[name], claims_per_round))
        return best


def run(quick: bool, backends: tuple[str, ...] = ("sqlite", "postgres")) -> list[Row]:
    per_round = 200 if quick else 600
    rows = []
    for kind in backends:
        rates = measure(kind, per_round)
        ratio = rates["limits"] / rates["none"]
        name = "SQLite" if kind == "sqlite" else "PostgreSQL"
        rows.append(Row(f"{name}: claims/s, {KEYS:,} keys, no limits", rate(rates["none"]), "baseline"))
        rows.append(
            Row(
                f"{name}: claims/s, {KEYS:,} keys, max_running 2 per key and a queue rate",
                rate(rates["limits"]),
                f"{ratio:.2f}x no limits",
                ">= 0.80x no limits",
                ratio >= 0.8,
            )
        )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="200 claims a round instead of 600")
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    args = parser.parse_args()
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    print_table("Claims with flow limits against none", run(args.quick, backends))


if __name__ == "__main__":
    main()
