"""A supervised worker pool over the benchmark workflows, stopped with SIGTERM:
``python benchmarks/pool.py --url URL --concurrency N``. Each child opens its own store
after the fork; settings are the library's defaults (lease 30 s, heartbeat 10 s, idle
backoff from ``--min-backoff-ms`` to 5 s, claims sized by the library's default unless
``--claim-batch`` gives ``auto`` or a number)."""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta

from common import registry

from runifold_sync import LeaseDuration, WorkerId, WorkflowWorker, open_store
from runifold_sync.model.cancellation import CancellationToken
from runifold_sync.pool.supervisor import WorkflowSupervisor, WorkflowSupervisorConfig

LEASE = LeaseDuration(timedelta(seconds=30))
HEARTBEAT = timedelta(seconds=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--min-backoff-ms", type=float, default=25.0)
    parser.add_argument("--max-backoff-ms", type=float, default=5000.0)
    parser.add_argument(
        "--claim-batch",
        type=lambda text: text if text == "auto" else int(text),
        default=None,
        help="tasks each worker claims at once: a number, or auto",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    claims = {} if args.claim_batch is None else {"claim_batch": args.claim_batch}

    def factory(worker_id: WorkerId) -> WorkflowWorker:
        return WorkflowWorker(open_store(args.url), registry(), worker_id, LEASE, HEARTBEAT, **claims)

    config = WorkflowSupervisorConfig(args.concurrency).with_backoff(
        timedelta(milliseconds=args.min_backoff_ms), timedelta(milliseconds=args.max_backoff_ms)
    )
    WorkflowSupervisor(factory, config, base_id="bench").run(CancellationToken())


if __name__ == "__main__":
    main()
