"""pgqueuer, one-step tasks: enqueue N no-op jobs, drain them with P processes. Run by
``peers.py`` with the peers' virtualenv, on asyncpg (pgqueuer's default driver) and
pgqueuer's default worker settings (batch size 10, unlimited concurrency, drain mode to
stop when the queue is empty).

``setup``: install the schema and enqueue N jobs in one batch. ``work``: one process of
P; it connects, says ``ready``, waits for ``go`` on stdin, drains, and prints one JSON
line with its start time, the time drain mode returned (its completions flushed) and how
many jobs it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import asyncpg
from pgqueuer import Job, Queries, QueueManager
from pgqueuer.db import AsyncpgDriver
from pgqueuer.types import QueueExecutionMode


async def setup(url: str, count: int) -> dict[str, object]:
    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        await queries.install()
        await queries.enqueue(["noop"] * count, [None] * count, [0] * count)
    finally:
        await conn.close()
    return {"enqueued": count}


async def bulk(url: str, count: int, batch: int) -> dict[str, object]:
    """``count`` jobs enqueued in batches of ``batch`` (one ``enqueue`` call each), timed;
    the schema installed by ``setup`` first."""
    conn = await asyncpg.connect(url)
    try:
        queries = Queries(AsyncpgDriver(conn))
        start = time.perf_counter()
        for _ in range(count // batch):
            await queries.enqueue(["noop"] * batch, [None] * batch, [0] * batch)
        seconds = time.perf_counter() - start
    finally:
        await conn.close()
    return {"enqueued": count // batch * batch, "seconds": seconds}


async def work(url: str) -> dict[str, object]:
    conn = await asyncpg.connect(url)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    done = 0
    last = 0.0

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        nonlocal done, last
        done += 1
        last = time.time()

    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    start = time.time()
    await qm.run(mode=QueueExecutionMode.drain)
    # pgqueuer buffers job completions and writes them in batches: a job is durably done
    # once drain mode returned (after its last flush), later than its body's end.
    flushed = time.time()
    await conn.close()
    return {"start": start, "end": flushed, "done": done, "last_body_end": last}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("setup", "work", "bulk"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    if args.role == "bulk":
        print(json.dumps(asyncio.run(bulk(args.url, args.count, args.batch))), flush=True)
        return
    coro = setup(args.url, args.count) if args.role == "setup" else work(args.url)
    print(json.dumps(asyncio.run(coro)), flush=True)


if __name__ == "__main__":
    main()
