"""The physical limit: single-row committed UPDATEs per second on one connection (and,
for PostgreSQL, on 4 connections in 4 processes, each updating its own row). Each figure
is the best of 3 samples taken in turns, since other load on the machine only ever
lowers it.

SQLite runs with the store's settings (WAL, ``synchronous=FULL``); PostgreSQL with the
server's (``synchronous_commit`` as configured). ``python benchmarks/commit_limit.py``.
"""

from __future__ import annotations

import multiprocessing
import sqlite3
import time
from dataclasses import dataclass

import psycopg
from common import (
    CpuMeter,
    Row,
    arg_parser,
    fresh_postgres,
    fresh_sqlite,
    print_table,
    progress,
    rate,
    retry_on_restart,
)

from runifold_sync.store.open import sqlite_path

_UPDATE_SQLITE = "UPDATE bench_commit SET v = v + 1 WHERE id = ?"
_UPDATE_PG = "UPDATE bench_commit SET v = v + 1 WHERE id = %s"


@dataclass(frozen=True)
class Write:
    """One autocommit statement a loop repeats: its text for SQLite (``?`` placeholders)
    and for PostgreSQL (``%s``), and its parameters, taken in turn (SQLite writes nothing
    for an UPDATE that leaves a row as it was)."""

    sqlite: str
    postgres: str
    params: tuple[tuple[object, ...], ...]


def row_update(row_id: int) -> Write:
    """The commit limit's write: one integer of one row of a two-column table."""
    return Write(_UPDATE_SQLITE, _UPDATE_PG, ((row_id,),))


@dataclass(frozen=True)
class CommitLoop:
    commits: int
    wall_s: float
    cpu_s: float  # client CPU of the loop
    started: float  # wall clock (time.time()), comparable across processes
    ended: float

    @property
    def per_s(self) -> float:
        return self.commits / self.wall_s


def _prepare(url: str, rows: int) -> None:
    ddl = "CREATE TABLE bench_commit (id INTEGER PRIMARY KEY, v BIGINT NOT NULL)"
    if url.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(url)) as conn:
            conn.execute(ddl)
            conn.executemany("INSERT INTO bench_commit VALUES (?, 0)", [(i,) for i in range(rows)])
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute(ddl)
        pg.execute("INSERT INTO bench_commit SELECT i, 0 FROM generate_series(0, %s) AS i", (rows - 1,))


def _loop(url: str, write: Write, start_at: float, duration_s: float) -> CommitLoop:
    """``write`` in autocommit, again and again, from ``start_at`` (wall clock) for
    ``duration_s``."""
    if url.startswith("sqlite"):
        lite = sqlite3.connect(sqlite_path(url), isolation_level=None)
        lite.execute("PRAGMA journal_mode=WAL")
        lite.execute("PRAGMA synchronous=FULL")
        execute = lite.execute
        statement, close = write.sqlite, lite.close
    else:
        pg = psycopg.connect(url, autocommit=True)
        execute = pg.execute  # type: ignore[assignment]
        statement, close = write.postgres, pg.close
    turns = write.params
    try:
        execute(statement, turns[0])  # warm up (and prepare, where the driver does)
        time.sleep(max(0.0, start_at - time.time()))
        started, wall0, cpu0 = time.time(), time.perf_counter(), time.process_time()
        end = wall0 + duration_s
        commits = 0
        while time.perf_counter() < end:
            execute(statement, turns[commits % len(turns)])
            commits += 1
        wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        return CommitLoop(commits, wall_s, cpu_s, started, time.time())
    finally:
        close()


def measure_commit_loop(url: str, *, duration_s: float, prepare: bool = True) -> CommitLoop:
    """One connection, in this process, on a fresh table in the database ``url`` names."""
    if prepare:
        _prepare(url, 1)
    return _loop(url, row_update(0), time.time(), duration_s)


def measure_write_loop(url: str, write: Write, *, duration_s: float) -> CommitLoop:
    """``write`` on one connection, in this process, in the database ``url`` names."""
    return _loop(url, write, time.time(), duration_s)


def _child(args: tuple[str, int, float, float]) -> CommitLoop:
    url, row_id, start_at, duration_s = args
    return _loop(url, row_update(row_id), start_at, duration_s)


@dataclass(frozen=True)
class ParallelCommits:
    per_s: float
    cpu_us_per_commit: float | None  # the whole machine's CPU, server included


def measure_parallel_commits(
    url: str, *, connections: int, duration_s: float, prepare: bool = True
) -> ParallelCommits:
    """Commits per second of ``connections`` processes started together, over the span
    from the first one's start to the last one's end, and the machine's CPU per commit
    over that span."""
    if prepare:
        _prepare(url, connections)
    start_at = time.time() + 2.0  # every process connected and warmed up by then
    context = multiprocessing.get_context("spawn")
    with CpuMeter(with_server=False) as meter, context.Pool(connections) as pool:
        loops = pool.map(_child, [(url, i, start_at, duration_s) for i in range(connections)])
    first, last = min(loop.started for loop in loops), max(loop.ended for loop in loops)
    per_s = sum(loop.commits for loop in loops) / (last - first)
    cpu = meter.between(first, last)
    return ParallelCommits(per_s, None if cpu is None else cpu.us_per(per_s))


@dataclass(frozen=True)
class CommitLimits:
    sqlite: float
    postgres_1: float
    postgres_4: float
    postgres_4_cpu_us: float | None = None  # per commit, of the best sample


SAMPLES = 3


@retry_on_restart
def measure_limits(duration_s: float) -> CommitLimits:
    """Best of ``SAMPLES`` turns of ``duration_s / SAMPLES`` for each figure."""
    sample_s = duration_s / SAMPLES
    with fresh_sqlite() as lite_url, fresh_postgres() as pg1_url, fresh_postgres() as pg4_url:
        _prepare(lite_url, 1)
        _prepare(pg1_url, 1)
        _prepare(pg4_url, 4)
        lite = pg1 = 0.0
        pg4 = ParallelCommits(0.0, None)
        for turn in range(1, SAMPLES + 1):
            progress(f"commit limit: SQLite, PostgreSQL 1 and 4 connections, sample {turn} of {SAMPLES}")
            lite = max(lite, measure_commit_loop(lite_url, duration_s=sample_s, prepare=False).per_s)
            pg1 = max(pg1, measure_commit_loop(pg1_url, duration_s=sample_s, prepare=False).per_s)
            parallel = measure_parallel_commits(pg4_url, connections=4, duration_s=sample_s, prepare=False)
            pg4 = max(pg4, parallel, key=lambda commits: commits.per_s)
    return CommitLimits(lite, pg1, pg4.per_s, pg4.cpu_us_per_commit)


def rows_for(limits: CommitLimits) -> list[Row]:
    return [
        Row("commit limit: SQLite FULL, 1 connection", rate(limits.sqlite), "baseline"),
        Row("commit limit: PostgreSQL, 1 connection", rate(limits.postgres_1), "baseline"),
        Row(
            "commit limit: PostgreSQL, 4 connections",
            rate(limits.postgres_4),
            f"{limits.postgres_4 / limits.postgres_1:.2f}x 1 connection"
            + (
                ""
                if limits.postgres_4_cpu_us is None
                else f"; {limits.postgres_4_cpu_us:,.0f} µs CPU per commit (whole machine, server included)"
            ),
        ),
    ]


def run(quick: bool) -> tuple[CommitLimits, list[Row]]:
    limits = measure_limits(3.0 if quick else 9.0)
    return limits, rows_for(limits)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="3 s per figure instead of 9 s")
    args = parser.parse_args()
    print_table("Commit limit", run(args.quick)[1])


if __name__ == "__main__":
    main()
