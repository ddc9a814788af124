"""DBOS, the same workflow shape: N workflows of K trivial steps. Run by ``peers.py`` with
the peers' virtualenv (never imported by the runifold_sync benchmarks).

``setup``: create and migrate the system database (a SQLite file is first put in WAL
mode, which persists in the file). ``work``: one process of P; it launches DBOS, says
``ready``, waits for ``go`` on stdin, then calls its share of the workflows directly
(DBOS's fastest path: no queue polling), and prints one JSON line with its times.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time

from dbos import DBOS, DBOSConfig


@DBOS.step()
def work(value: int) -> int:
    return value + 1


@DBOS.workflow()
def run_steps(steps: int) -> int:
    value = 0
    for _ in range(steps):
        value = work(value)
    return value


def _config(url: str, executor: str) -> DBOSConfig:
    return {
        "name": "runifold-bench",
        "system_database_url": url,
        "executor_id": executor,
        "log_level": "WARNING",
    }


def setup(url: str) -> dict[str, object]:
    info: dict[str, object] = {}
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        with sqlite3.connect(path) as conn:
            info["journal_mode"] = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    DBOS.migrate(url)
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            info["journal_mode_after_migrate"] = conn.execute("PRAGMA journal_mode").fetchone()[0]
    return info


def work_share(url: str, index: int, processes: int, count: int, steps: int) -> dict[str, object]:
    DBOS(config=_config(url, f"bench-{index}"))
    DBOS.launch()
    mine = len(range(index, count, processes))
    run_steps(steps)  # warm up: engine connections, registration
    info: dict[str, object] = {}
    if url.startswith("sqlite"):  # DBOS sets neither pragma: the file's mode, the build's default
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}[
                conn.execute("PRAGMA synchronous").fetchone()[0]
            ]
        info["sqlite"] = f"journal_mode={mode}, synchronous={synchronous}"
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    for _ in range(mine):
        if run_steps(steps) != steps:
            raise RuntimeError("wrong workflow result")
    end = time.time()
    DBOS.destroy()
    return {"start": start, "end": end, "done": mine, **info}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("setup", "work"))
    parser.add_argument("--url", required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if args.role == "setup":
        result = setup(args.url)
    else:
        result = work_share(args.url, args.index, args.processes, args.count, args.steps)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
