"""Shared pieces of the benchmarks: fresh databases, the benchmark workflows, a worker pool
in a subprocess, drain timing and the result table.

Every PostgreSQL benchmark runs in its own database (``runifold_bench_<random>``, dropped
afterwards) on the server named by ``RUNIFOLD_BENCH_POSTGRES_URL`` (default: the local
server the tests use); every SQLite benchmark in a new file in a temporary directory.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import ParamSpec, TypeVar
from urllib.parse import urlsplit

import psycopg

from runifold_sync import (
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    open_store,
)
from runifold_sync.errors import StoreUnavailable
from runifold_sync.store import TaskOutcome, TaskState
from runifold_sync.store.open import sqlite_path

# A pool's claim_batch: a number, "auto", or None for the library's default.
ClaimBatch = int | str | None
P = ParamSpec("P")
T = TypeVar("T")
# The parent's pool logs each failed reconnect while a server restarts; retries say it.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PG_ADMIN_URL = os.environ.get("RUNIFOLD_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
DEFAULT_MIN_BACKOFF = timedelta(milliseconds=25)  # WorkflowSupervisorConfig's default
# Tasks are enqueued due this far in the future, so every worker of a pool is up and idle
# when they become claimable: the measured span starts with all processes ready.
START_DELAY = timedelta(seconds=1.5)
# N for the workflow-shaped benchmarks (throughput and DBOS), full and --quick.
WORKFLOWS, QUICK_WORKFLOWS = 500, 200

# --- the benchmark workflows ------------------------------------------------------------

bench_flow = Workflow("bench-flow", 1)
latency_flow = Workflow("bench-latency", 1)


@bench_flow.step()
def work(ctx: StepContext, value: int) -> int:
    return value + 1


@bench_flow.main
def run_steps(ctx: WorkflowContext, steps: int) -> int:
    """``steps`` trivial steps, each committed on its own."""
    value = 0
    for _ in range(steps):
        value = work(ctx, value)
    return value


@latency_flow.step()
def started(ctx: StepContext) -> float:
    return time.time()


@latency_flow.main
def run_latency(ctx: WorkflowContext, label: str) -> float:
    """Returns the wall time at which its first (only) step body started."""
    return float(started(ctx))


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(bench_flow))
    reg.register(WorkflowDefinition(latency_flow))
    return reg


def enqueue_workflows(store: WorkflowStore, count: int, steps: int, *, delay: timedelta | None) -> None:
    """``count`` bench-flow tasks, all due ``delay`` from now (store time), a thousand
    per transaction."""
    not_before = None if delay is None else store.now() + delay
    for start in range(0, count, 1000):
        batch = min(1000, count - start)
        store.enqueue_many(
            [WorkflowTask.new("bench-flow", 1, steps, not_before=not_before) for _ in range(batch)]
        )


# --- fresh databases --------------------------------------------------------------------


def admin_connection() -> psycopg.Connection[tuple[object, ...]]:
    """An autocommit connection to the admin database, retried while the server restarts
    (other sessions may restart it briefly)."""
    for attempt in range(20):
        try:
            return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
        except psycopg.OperationalError:
            if attempt == 19:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def postgres_url(dbname: str) -> str:
    return urlsplit(PG_ADMIN_URL)._replace(path=f"/{dbname}").geturl()


def _postmaster_started() -> object:
    with admin_connection() as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    assert row is not None
    return row[0]


TRIES = 5
_CONNECTION_ERRORS = (psycopg.OperationalError, StoreUnavailable, TimeoutError)


class ServerRestarted(RuntimeError):
    """PostgreSQL restarted while a figure was being measured: the figure is void."""


def retry_on_restart(fn: Callable[P, T]) -> Callable[P, T]:
    """Measure again (up to ``TRIES`` times, waiting longer each time) when PostgreSQL
    restarted or dropped connections during the measurement: other sessions on this
    machine may restart it briefly."""

    @functools.wraps(fn)
    def measured(*args: P.args, **kwargs: P.kwargs) -> T:
        for attempt in range(1, TRIES + 1):
            before = _postmaster_started()
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                restarted = _postmaster_started() != before
                if attempt == TRIES or not (restarted or isinstance(exc, _CONNECTION_ERRORS)):
                    raise
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                progress(f"{fn.__name__}: {type(exc).__name__}: {first_line[:200]}; measuring again")
                time.sleep(5 * attempt)
                continue
            if _postmaster_started() == before:
                return result
            if attempt == TRIES:
                raise ServerRestarted("PostgreSQL restarted during every try of the measurement")
            progress(f"{fn.__name__}: PostgreSQL restarted during the measurement; measuring again")
            time.sleep(5 * attempt)
        raise AssertionError("unreachable")

    return measured


@contextmanager
def fresh_postgres(settings: Mapping[str, str] | None = None) -> Iterator[str]:
    """A new empty database, ``settings`` its connections' defaults; yields its URL and
    drops it afterwards."""
    name = f"runifold_bench_{uuid.uuid4().hex[:12]}"
    with admin_connection() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        for key, value in (settings or {}).items():
            conn.execute(f'ALTER DATABASE "{name}" SET {key} = {value}')
    try:
        yield postgres_url(name)
    finally:
        with admin_connection() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def fresh_sqlite() -> Iterator[str]:
    """A URL naming a new SQLite file in a temporary directory (removed afterwards)."""
    with tempfile.TemporaryDirectory(prefix="runifold-bench-") as tmp:
        yield f"sqlite:///{tmp}/bench.db"


@contextmanager
def fresh_store(kind: str) -> Iterator[str]:
    """``kind`` is ``sqlite`` or ``postgres``."""
    with fresh_postgres() if kind == "postgres" else fresh_sqlite() as url:
        yield url


# --- a worker pool in a subprocess -----------------------------------------------------


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a process running ``tree``'s package and benchmarks: its
    package ahead of the one installed in this interpreter's environment."""
    if tree == ROOT:
        return dict(os.environ)
    return dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'benchmarks'}")


@contextmanager
def running_pool(
    url: str,
    processes: int,
    *,
    min_backoff: timedelta = DEFAULT_MIN_BACKOFF,
    claim_batch: ClaimBatch = None,
    tree: Path = ROOT,
) -> Iterator[subprocess.Popen[str]]:
    """A supervisor (``benchmarks/pool.py``) with ``processes`` worker children, stopped
    with SIGTERM (the supervisor's own shutdown) when the block ends. Its log is shown
    only when the block fails. ``claim_batch`` None leaves the library's default.
    ``tree`` is the checkout whose pool script and package run: another revision
    exported as ``ab.py`` does it runs its own code."""
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(tree / "benchmarks" / "pool.py"),
                "--url",
                url,
                "--concurrency",
                str(processes),
                "--min-backoff-ms",
                str(min_backoff / timedelta(milliseconds=1)),
                *([] if claim_batch is None else ["--claim-batch", str(claim_batch)]),
            ],
            cwd=tree,
            env=tree_env(tree),
            stdout=subprocess.DEVNULL,
            stderr=log,
            text=True,
            start_new_session=True,
        )
        try:
            yield proc
        except BaseException:
            log.seek(0)
            progress("worker pool log (tail):\n" + log.read()[-4000:])
            raise
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def wait_completed(store: WorkflowStore, count: int, *, timeout_s: float = 180.0) -> None:
    """Until ``count`` tasks completed; fails on a failed task or after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        completed = failed = 0
        for stats in store.queue_stats():
            if stats.state is TaskState.TERMINAL and stats.outcome is TaskOutcome.COMPLETED:
                completed += stats.count
            elif stats.state is TaskState.TERMINAL:
                failed += stats.count
        if failed:
            raise RuntimeError(f"{failed} benchmark tasks failed")
        if completed >= count:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"only {completed} of {count} tasks completed in {timeout_s} s")
        time.sleep(0.05)


def drain_window(url: str) -> tuple[float, float]:
    """Store times (seconds since the epoch) of the first claim and the last completion,
    from the history events."""
    if url.startswith("sqlite"):
        with sqlite3.connect(sqlite_path(url)) as conn:
            first, last = conn.execute(
                "SELECT MIN(at) FILTER (WHERE kind = 'claimed'), MAX(at) FILTER (WHERE kind = 'completed')"
                " FROM runifold_events"
            ).fetchone()
        return first / 1e6, last / 1e6
    with psycopg.connect(url) as pg:
        row = pg.execute(
            "SELECT EXTRACT(EPOCH FROM MIN(at) FILTER (WHERE kind = 'claimed'))::float8,"
            " EXTRACT(EPOCH FROM MAX(at) FILTER (WHERE kind = 'completed'))::float8 FROM runifold_events"
        ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


# --- CPU use of the whole machine while a pool drains ----------------------------------


@functools.cache
def _postmaster_pid() -> int:
    """The PostgreSQL server's parent process: the parent of this session's backend."""
    with admin_connection() as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    with open(f"/proc/{row[0]}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def _cpu_ticks(pid: int, *, reaped: bool) -> int:
    """User and system ticks of ``pid`` (and, with ``reaped``, of its children that have
    exited and been waited for); 0 once it has gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(field) for field in fields[11 : 15 if reaped else 13])


def server_cpu_s() -> float | None:
    """CPU time used so far by the local PostgreSQL server (user and system): the
    postmaster with the backends and background workers it has reaped, plus those still
    running. Reading the postmaster's children is cheap enough to sample every few
    milliseconds, where scanning all of /proc cost about 1 ms a time. None when the
    server is not on this machine."""
    if urlsplit(PG_ADMIN_URL).hostname not in (None, "", "localhost", "127.0.0.1", "::1"):
        return None
    try:
        postmaster = _postmaster_pid()
        with open(f"/proc/{postmaster}/task/{postmaster}/children") as children:
            pids = [int(pid) for pid in children.read().split()]
    except OSError:
        return None
    ticks = _cpu_ticks(postmaster, reaped=True) + sum(_cpu_ticks(pid, reaped=False) for pid in pids)
    return ticks / os.sysconf("SC_CLK_TCK")


def busy_cpu_s() -> float:
    """CPU time all cores of the machine spent busy (not idle, not waiting for I/O) since boot."""
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:9]]
    idle, iowait = ticks[3], ticks[4]
    return (sum(ticks) - idle - iowait) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuUse:
    """What the machine's processes used over ``seconds`` of wall time."""

    seconds: float
    busy_s: float  # all processes, all cores
    server_s: float | None  # PostgreSQL server processes (None on SQLite)

    @property
    def busy_cores(self) -> float:
        return self.busy_s / self.seconds

    def us_per(self, per_s: float) -> float:
        """CPU microseconds per unit of work done at ``per_s`` units a second."""
        return self.busy_s / (per_s * self.seconds) * 1e6


class CpuMeter:
    """Samples the machine's busy CPU time (and the PostgreSQL server's) every 20 ms in a
    thread, so the CPU of a drain can be cut out of a longer run once its first claim and
    last completion are known. Everything on the machine counts, this script included:
    the figure says how close to saturated the cores were, not what one process cost."""

    INTERVAL_S = 0.02

    def __init__(self, with_server: bool) -> None:
        self._with_server = with_server
        self._samples: list[tuple[float, float, float | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="cpu-meter", daemon=True)

    def __enter__(self) -> CpuMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample_until_stopped(self) -> None:
        while True:
            self._samples.append((time.time(), busy_cpu_s(), server_cpu_s() if self._with_server else None))
            if self._stop.wait(self.INTERVAL_S):
                return

    def between(self, start: float, end: float) -> CpuUse | None:
        """Use between the first sample at or after ``start`` and the last at or before
        ``end`` (wall-clock seconds); None when the window holds fewer than two samples."""
        inside = [sample for sample in self._samples if start <= sample[0] <= end]
        if len(inside) < 2:
            return None
        (t0, busy0, server0), (t1, busy1, server1) = inside[0], inside[-1]
        server = None if server0 is None or server1 is None else server1 - server0
        return CpuUse(t1 - t0, busy1 - busy0, server)


@dataclass(frozen=True)
class Throughput:
    workflows: int
    steps: int  # per workflow
    processes: int
    seconds: float
    claim_batch: ClaimBatch = None  # None: the library's default
    cpu: CpuUse | None = None  # the machine's, while this drain ran

    @property
    def claims(self) -> str:
        """How its workers sized their claims, for a table."""
        return "the default claim size" if self.claim_batch is None else f"claim batch {self.claim_batch}"

    @property
    def steps_per_s(self) -> float:
        return self.workflows * self.steps / self.seconds

    @property
    def workflows_per_s(self) -> float:
        return self.workflows / self.seconds


def measure_pool(
    url: str, *, workflows: int, steps: int, processes: int, claim_batch: ClaimBatch = None
) -> Throughput:
    """Drain ``workflows`` tasks of ``steps`` steps with a pool of ``processes`` workers:
    from the first claim to the last completion, all workers started beforehand."""
    store = open_store(url)
    try:
        enqueue_workflows(store, workflows, steps, delay=START_DELAY)
        with CpuMeter(with_server=url.startswith("postgresql")) as meter:
            with running_pool(url, processes, claim_batch=claim_batch):
                wait_completed(store, workflows)
    finally:
        store.close()
    first, last = drain_window(url)
    return Throughput(workflows, steps, processes, last - first, claim_batch, meter.between(first, last))


@retry_on_restart
def measure_fresh(
    kind: str, *, workflows: int, steps: int, processes: int, claim_batch: ClaimBatch = None
) -> Throughput:
    with fresh_store(kind) as url:
        return measure_pool(
            url, workflows=workflows, steps=steps, processes=processes, claim_batch=claim_batch
        )


# --- the result table -------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One figure: its value, its ratio to the baseline of the same run, and the issue's
    target for it when there is one (``met`` None: no target, or not measured)."""

    figure: str
    value: str
    ratio: str = ""
    target: str = ""
    met: bool | None = None

    @property
    def status(self) -> str:
        if self.value.startswith("not measured"):
            return "not measured" if self.target else ""
        if self.met is None:
            return ""
        return "met" if self.met else "NOT MET"


def not_measured(figure: str, why: str, target: str = "") -> Row:
    """A figure that could not be measured, with why (cut to keep the table readable)."""
    why = " ".join(why.split())
    return Row(figure, f"not measured: {why if len(why) <= 150 else why[:147] + '...'}", target=target)


def rate(value: float, unit: str = "/s") -> str:
    return f"{value:,.0f}{unit}" if value >= 100 else f"{value:,.1f}{unit}"


def print_table(title: str, rows: list[Row]) -> None:
    headers = ("figure", "value", "ratio", "target", "status")
    cells = [headers, *((r.figure, r.value, r.ratio, r.target, r.status) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    print(f"\n{title}")
    print(line)
    for i, cell in enumerate(cells):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(cell, widths, strict=True)) + " |")
        if i == 0:
            print(line)
    print(line, flush=True)


def arg_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser whose help is the script's docstring."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def progress(message: str) -> None:
    """Progress goes to stderr so stdout keeps only the tables."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
