"""procrastinate, one-step tasks: defer N no-op jobs, drain them with P processes. Run by
``peers.py`` with the peers' virtualenv, with procrastinate's default worker settings
(concurrency 1, LISTEN/NOTIFY) and ``wait=False`` so a worker stops once it caught up.

``setup``: apply the schema and defer N jobs in one batch. ``work``: one process of P;
it opens the app, says ``ready``, waits for ``go`` on stdin, runs the worker, and prints
one JSON line with its start time, the time its last job finished and how many it ran.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time

import procrastinate

STATE = {"done": 0, "last": 0.0}
app = procrastinate.App(connector=procrastinate.PsycopgConnector())


@app.task(name="noop")
async def noop() -> None:
    STATE["done"] += 1
    STATE["last"] = time.time()


async def setup(url: str, count: int) -> dict[str, object]:
    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=url)):
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            await noop.batch_defer_async(*({} for _ in range(count)))
    return {"enqueued": count}


async def bulk(url: str, count: int, batch: int) -> dict[str, object]:
    """``count`` jobs deferred in batches of ``batch`` (one ``batch_defer_async`` each),
    timed; the schema applied by ``setup`` first."""
    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=url)):
        async with app.open_async():
            start = time.perf_counter()
            for _ in range(count // batch):
                await noop.batch_defer_async(*({} for _ in range(batch)))
            seconds = time.perf_counter() - start
    return {"enqueued": count // batch * batch, "seconds": seconds}


async def work(url: str, index: int) -> dict[str, object]:
    with app.replace_connector(procrastinate.PsycopgConnector(conninfo=url)):
        async with app.open_async():
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            start = time.time()
            await app.run_worker_async(wait=False, name=f"bench-{index}", install_signal_handlers=False)
    done = int(STATE["done"])
    # procrastinate records each job's end right after its body returns.
    return {"start": start, "end": STATE["last"] if done else start, "done": done}


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
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
    coro = setup(args.url, args.count) if args.role == "setup" else work(args.url, args.index)
    print(json.dumps(asyncio.run(coro)), flush=True)


if __name__ == "__main__":
    main()
