"""Dead tuples and table size under a steady load, with autovacuum on at PostgreSQL's
defaults: ``python benchmarks/dead_tuples.py [--minutes 30] [--quick] [--baseline cd3fa84]``.

The shared server (127.0.0.1:5432) has autovacuum off in its configuration, so this
benchmark makes a private cluster of its own (``pg_createcluster`` on a free port, as root
or the ``postgres`` user), checks that autovacuum is on there with every autovacuum
setting at its default, and drops the cluster at the end (also on Ctrl-C or an error).
Each measurement below gets a fresh database in that cluster.

For this checkout and for ``--baseline`` (a git revision exported with ``git archive``
into a temporary directory, as ``ab.py`` does, its own pool and package running from
there; ``--baseline none`` skips it), in turn:

1. Peak: a supervised pool of 4 worker processes (``benchmarks/pool.py``, the library's
   default settings) takes one-step tasks from a backlog kept above 20,000 for 60 s
   (30 s with ``--quick``), after 10 s of warm-up: completed tasks a second is the peak.
2. Steady run: a producer process enqueues one-step tasks at 70% of that revision's peak,
   with ``enqueue_many`` every 100 ms, while a pool of 4 takes them, for ``--minutes``
   (30; 3 with ``--quick``; the baseline ``--baseline-minutes``, by default the same).
   Every 30 s it samples, for every ``runifold_*`` table, ``pg_stat_user_tables``
   (``n_dead_tup``, ``n_live_tup``, ``last_autovacuum``, ``autovacuum_count``) and
   ``pg_total_relation_size``, with the tasks completed so far and the queue depth
   (tasks not finished); the samples go to a CSV (``--out``) and a PNG (``--plot``).

Figures, per revision: the peak, the steady rate achieved (tasks completed in the steady
run over its length, with the tasks left unfinished at its end), the peak dead tuples
(the largest sample of the sum over all ``runifold_*`` tables, and of ``runifold_tasks``
alone), the peak dead tuples per task completed (that largest sum over the tasks completed
by that sample: the issue's figure), the same over the tasks completed in the minute
before that sample (autovacuum looks at a database once a minute by default; a figure
that does not shrink as finished tasks pile up over a long run), and flatness.

Flatness compares a run's last window with its first, the window being 5 minutes, or a
third of a run shorter than 15 minutes: the largest sample in the last window over the
largest in the first window (the sample at 0 s left out), for the dead tuples (the sum
over all tables: autovacuum makes them a sawtooth, so a window's top is compared, not
one sample), for the total size of the ``runifold_*`` tables with their indexes and
TOAST, and for that size a task stored (size over the rows of ``runifold_tasks``). The
library keeps finished tasks until they are pruned (no retention here, the library's
default), so the total size grows with the tasks stored whatever vacuum does; the size a
task stored is what bloat (space vacuum does not hand back for reuse) would raise.
Targets: each flatness at most 1.5x, and this checkout's peak dead tuples per task at
most a third of the baseline's.

``--from-csv CSV`` prints the table and draws the plot of an earlier run again from its
samples, without measuring.

Rates are the shared machine's of the moment (2 cores, other sessions' work): the dead
tuples and sizes depend on them only through the number of tasks, which the per-task
figure divides out.
"""

from __future__ import annotations

import csv
import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
from ab import export
from common import HERE, ROOT, Row, arg_parser, print_table, progress, rate, running_pool, tree_env

PROCESSES = 4
STEADY_SHARE = 0.7  # of the peak
SAMPLE_EVERY_S = 30.0
PEAK_BACKLOG = 20_000
PEAK_WARMUP_S = 10.0
FLAT_WINDOW_S = 300.0
FLAT_TARGET = 1.5
PER_TASK_TARGET = 1 / 3
MAIN_TABLE = "runifold_tasks"

# --- a private cluster with autovacuum on -----------------------------------------------

CLUSTER_PREFIX = "runifold_bench_"
CLUSTER_LOCK = Path("/tmp/runifold-bench-pgcluster.lock")
TRUST_ALL = "local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n"
CLUSTER_TOOLS = ("pg_createcluster", "pg_ctlcluster", "pg_dropcluster", "pg_lsclusters")


class ClusterError(Exception):
    """A pg_* cluster command failed, or no private cluster can be made here."""


def _pg(*args: str, timeout_s: float = 300.0) -> str:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


def _clusters() -> list[tuple[str, str, int]]:
    """(version, name, port) of every cluster ``pg_lsclusters`` knows."""
    listed = []
    for line in _pg("pg_lsclusters", "--no-header").splitlines():
        version, name, port, *_ = line.split()
        listed.append((version, name, int(port)))
    return listed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextmanager
def private_cluster() -> Iterator[str]:
    """A new cluster on a free port, trusting local connections, autovacuum on at its
    defaults (the shared server's ``conf.d`` is not copied); yields its admin URL and
    drops it when the block ends. A cluster left by a run killed before its teardown
    (its creator's pid, in its name, gone) is dropped first."""
    missing = [tool for tool in CLUSTER_TOOLS if shutil.which(tool) is None]
    if missing:
        raise ClusterError(f"{', '.join(missing)} not on PATH (install postgresql-common)")
    if os.geteuid() != 0 and pwd.getpwuid(os.geteuid()).pw_name != "postgres":
        raise ClusterError("pg_createcluster needs root or the postgres user")
    version = sorted(os.listdir("/etc/postgresql"), key=lambda v: [int(p) for p in v.split(".")])[-1]
    with open(CLUSTER_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = set()
        for listed_version, name, port in _clusters():
            taken.add(port)
            pid = name.removeprefix(CLUSTER_PREFIX).split("_")[0]
            if name.startswith(CLUSTER_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                _pg("pg_dropcluster", "--stop", listed_version, name)
        while True:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
            if port not in taken:
                break
        name = f"{CLUSTER_PREFIX}{os.getpid()}_{uuid.uuid4().hex[:8]}"
        _pg("pg_createcluster", version, name, "-p", str(port), "--", "--no-sync")
    try:
        Path(f"/etc/postgresql/{version}/{name}/pg_hba.conf").write_text(TRUST_ALL)
        _pg("pg_ctlcluster", "--skip-systemctl-redirect", version, name, "start")
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        _check_autovacuum(url)
        progress(f"private cluster {version}/{name} on port {port}, autovacuum on at its defaults")
        yield url
    finally:
        _pg("pg_dropcluster", "--stop", version, name)


def _check_autovacuum(url: str) -> None:
    """Refuses a cluster whose autovacuum is off or whose autovacuum settings are not
    PostgreSQL's defaults."""
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = psycopg.connect(url, autocommit=True, connect_timeout=2)
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with conn:
        changed = conn.execute(
            "SELECT name, setting FROM pg_settings WHERE (name LIKE 'autovacuum%' OR name = 'track_counts')"
            " AND source <> 'default'"
        ).fetchall()
        on = conn.execute("SELECT current_setting('autovacuum') = 'on'").fetchone()
    if changed or not on or not on[0]:
        raise ClusterError(f"the private cluster's autovacuum is not at its defaults: {changed}")


@contextmanager
def database(admin_url: str) -> Iterator[str]:
    """A new database in the private cluster; yields its URL, drops it afterwards."""
    name = f"runifold_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlsplit(admin_url)._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# --- the producer, run with a revision's own package ------------------------------------

# argv: url, rate (tasks/s; 0 keeps a backlog instead), seconds, backlog. Opens the store
# (migrating the database), says "ready", waits for a line, then enqueues one-step tasks
# until the time is up: paced, the count due by now every 100 ms (catching up after a slow
# batch, 2,000 at most a call); or, at rate 0, 2,000 at a time whenever fewer than
# ``backlog`` are queued, saying "filled" once the backlog was first reached.
_PRODUCER = """
import sys, time
import psycopg
from runifold_sync import WorkflowTask, open_store
url, rate, seconds, backlog = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
store = open_store(url)
print("ready", flush=True)
sys.stdin.readline()
tick, most = 0.1, 2000
def enqueue(count):
    store.enqueue_many([WorkflowTask.new("bench-flow", 1, 1) for _ in range(count)])
start = time.monotonic()
enqueued = 0
if rate > 0:
    ticks = 0
    while time.monotonic() - start < seconds:
        due = min(round(rate * (time.monotonic() - start)) - enqueued, most)
        if due > 0:
            enqueue(due)
            enqueued += due
        ticks += 1
        time.sleep(max(0.0, start + ticks * tick - time.monotonic()))
else:
    filled = False
    with psycopg.connect(url, autocommit=True) as pg:
        while time.monotonic() - start < seconds:
            queued = pg.execute("SELECT count(*) FROM runifold_tasks WHERE state = 'queued'").fetchone()[0]
            if queued < backlog:
                enqueue(most)
                continue
            if not filled:
                print("filled", flush=True)
                filled = True
            time.sleep(tick)
store.close()
"""


@contextmanager
def producing(tree: Path, url: str, *, rate_per_s: float, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """The producer, started (its store opened, the database migrated) but waiting for
    ``start_producing``; killed when the block ends if it has not finished."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _PRODUCER, url, repr(rate_per_s), repr(seconds), str(PEAK_BACKLOG)],
        cwd=tree,
        env=tree_env(tree),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _expect(proc, "ready")
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _expect(proc: subprocess.Popen[str], word: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != word:
        raise RuntimeError(f"the producer said {line!r}, not {word!r} (exit {proc.poll()})")


def start_producing(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()


# --- samples ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableSample:
    table: str
    dead: int
    live: int
    last_autovacuum: datetime | None
    autovacuums: int
    total_bytes: int


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the producer started
    completed: int
    unfinished: int  # the queue's depth: queued, leased or waiting
    stored: int  # rows of runifold_tasks
    tables: tuple[TableSample, ...]

    @property
    def dead(self) -> int:
        return sum(t.dead for t in self.tables)

    @property
    def total_bytes(self) -> int:
        return sum(t.total_bytes for t in self.tables)

    def table(self, name: str) -> TableSample | None:
        return next((t for t in self.tables if t.table == name), None)


def task_counts(url: str) -> tuple[int, int, int]:
    """Tasks completed, unfinished, and stored (the same columns in every revision)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'terminal' AND outcome = 'completed'),"
            " count(*) FILTER (WHERE state IN ('queued', 'leased', 'waiting')), count(*) FROM runifold_tasks"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def sample(url: str, t_s: float) -> Sample:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT relname, n_dead_tup, n_live_tup, last_autovacuum, autovacuum_count,"
            " pg_total_relation_size(relid) FROM pg_stat_user_tables"
            " WHERE relname LIKE 'runifold\\_%' ORDER BY relname"
        ).fetchall()
    completed, unfinished, stored = task_counts(url)
    tables = tuple(TableSample(str(r[0]), int(r[1]), int(r[2]), r[3], int(r[4]), int(r[5])) for r in rows)
    return Sample(t_s, completed, unfinished, stored, tables)


# --- the two measurements -----------------------------------------------------------------


@dataclass
class Run:
    """One revision's peak and steady run."""

    label: str
    tree: Path
    peak_per_s: float = 0.0
    steady_s: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    reloptions: dict[str, str] = field(default_factory=dict)

    @property
    def steady_per_s(self) -> float:
        last = self.samples[-1]
        return last.completed / last.t_s

    def peak_dead(self) -> Sample:
        return max(self.samples, key=lambda s: s.dead)

    def peak_dead_per_task(self) -> float:
        top = self.peak_dead()
        return top.dead / max(top.completed, 1)

    def peak_dead_per_recent_task(self) -> tuple[float, int]:
        """The peak dead tuples over the tasks completed in the minute before it (from
        the run's start for a peak in its first minute), and that count: the dead
        tuples as a share of the current rate of work, which the tasks completed since
        the start do not give once finished tasks pile up and vacuums of the table
        take longer."""
        top = self.peak_dead()
        before = [s for s in self.samples if s.t_s <= top.t_s - 60 + 1]
        recent = top.completed - (before[-1].completed if before else 0)
        return top.dead / max(recent, 1), recent

    def peak_table_dead(self, name: str) -> int:
        return max((t.dead for s in self.samples if (t := s.table(name)) is not None), default=0)

    def window_s(self) -> float:
        return min(FLAT_WINDOW_S, max(self.steady_s / 3, SAMPLE_EVERY_S))

    def flatness(self, measure: str) -> tuple[float, float]:
        """The top of ``measure`` (dead, size or size a task) in the first window and in
        the last (see the module's docstring)."""

        def value(s: Sample) -> float:
            if measure == "dead":
                return s.dead
            if measure == "size":
                return s.total_bytes
            return s.total_bytes / max(s.stored, 1)

        window = self.window_s()
        after_start = self.samples[1:]  # the first sample is of the empty database
        first = max(value(s) for s in after_start if s.t_s <= window + 1)
        last = max(value(s) for s in after_start if s.t_s >= self.samples[-1].t_s - window - 1)
        return first, last


def measure_peak(run: Run, admin_url: str, seconds: float) -> None:
    with database(admin_url) as url, producing(run.tree, url, rate_per_s=0, seconds=seconds * 4) as producer:
        start_producing(producer)
        _expect(producer, "filled")
        with running_pool(url, PROCESSES, tree=run.tree):
            time.sleep(PEAK_WARMUP_S)
            done0, t0 = task_counts(url)[0], time.monotonic()
            time.sleep(seconds)
            done1, t1 = task_counts(url)[0], time.monotonic()
    run.peak_per_s = (done1 - done0) / (t1 - t0)
    progress(f"{run.label}: peak {run.peak_per_s:,.0f} tasks/s ({done1 - done0:,} in {t1 - t0:.0f} s)")


def measure_steady(run: Run, admin_url: str, seconds: float, csv_path: Path, runs: list[Run]) -> None:
    run.steady_s = seconds
    target = run.peak_per_s * STEADY_SHARE
    with database(admin_url) as url, producing(run.tree, url, rate_per_s=target, seconds=seconds) as producer:
        with running_pool(url, PROCESSES, tree=run.tree):
            time.sleep(3.0)  # every worker up and idle
            start_producing(producer)
            start = time.monotonic()
            progress(f"{run.label}: steady run, {target:,.0f} tasks/s for {seconds / 60:.0f} min")
            next_at = 0.0
            while next_at <= seconds:
                time.sleep(max(0.0, start + next_at - time.monotonic()))
                got = sample(url, time.monotonic() - start)
                run.samples.append(got)
                tasks = got.table(MAIN_TABLE)
                progress(
                    f"{run.label} {got.t_s:5.0f} s: {got.completed:,} completed,"
                    f" {got.unfinished:,} unfinished,"
                    f" dead {got.dead:,} ({MAIN_TABLE} {tasks.dead if tasks else 0:,},"
                    f" autovacuums {tasks.autovacuums if tasks else 0}), {got.total_bytes / 2**20:,.1f} MB"
                )
                next_at += SAMPLE_EVERY_S
                write_csv(csv_path, runs)  # what was sampled survives an interrupted run
        with psycopg.connect(url, autocommit=True) as conn:
            options = conn.execute(
                "SELECT relname, array_to_string(reloptions, ', ') FROM pg_class"
                " WHERE relname LIKE 'runifold\\_%' AND relkind = 'r' AND reloptions IS NOT NULL"
            ).fetchall()
    run.reloptions = {str(name): str(opts) for name, opts in options}


# --- output -------------------------------------------------------------------------------


def write_csv(path: Path, runs: list[Run]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(
            [
                "revision",
                "peak_per_s",
                "steady_s",
                "t_s",
                "completed",
                "unfinished",
                "stored",
                "table",
                "n_dead_tup",
                "n_live_tup",
                "last_autovacuum",
                "autovacuum_count",
                "total_bytes",
            ]
        )
        for run in runs:
            for s in run.samples:
                for t in s.tables:
                    vacuumed = t.last_autovacuum.isoformat() if t.last_autovacuum else ""
                    writer.writerow(
                        [
                            run.label,
                            f"{run.peak_per_s:.1f}",
                            f"{run.steady_s:.0f}",
                            f"{s.t_s:.1f}",
                            s.completed,
                            s.unfinished,
                            s.stored,
                            t.table,
                            t.dead,
                            t.live,
                            vacuumed,
                            t.autovacuums,
                            t.total_bytes,
                        ]
                    )


def read_csv(path: Path) -> list[Run]:
    """Each revision's run as ``write_csv`` wrote it: peak, length and samples."""
    runs: dict[str, Run] = {}
    with path.open(newline="") as source:
        for line in csv.DictReader(source):
            label = line["revision"]
            run = runs.setdefault(label, Run(label, ROOT, float(line["peak_per_s"]), float(line["steady_s"])))
            t_s = float(line["t_s"])
            if not run.samples or run.samples[-1].t_s != t_s:
                counts = (int(line["completed"]), int(line["unfinished"]), int(line["stored"]))
                run.samples.append(Sample(t_s, *counts, ()))
            vacuumed = datetime.fromisoformat(line["last_autovacuum"]) if line["last_autovacuum"] else None
            table = TableSample(
                line["table"],
                int(line["n_dead_tup"]),
                int(line["n_live_tup"]),
                vacuumed,
                int(line["autovacuum_count"]),
                int(line["total_bytes"]),
            )
            last = run.samples[-1]
            run.samples[-1] = Sample(
                last.t_s, last.completed, last.unfinished, last.stored, (*last.tables, table)
            )
    return list(runs.values())


def plot(path: Path, runs: list[Run]) -> None:
    """Dead tuples of the tables that had most of them, and the total size, over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (dead_ax, size_ax) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    tops: dict[str, int] = {}
    for run in runs:
        for s in run.samples:
            for t in s.tables:
                tops[t.table] = max(tops.get(t.table, 0), t.dead)
    # The tables with most dead tuples in either run, each one colour in both runs.
    main = [name for name, top in sorted(tops.items(), key=lambda kv: -kv[1]) if top > 0][:4]
    colours = dict(zip(main, ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=False))
    for run, style in zip(runs, ("-", "--"), strict=False):
        minutes = [s.t_s / 60 for s in run.samples]
        dead_ax.plot(
            minutes, [s.dead for s in run.samples], style, color="black", label=f"{run.label}: all tables"
        )
        for name in main:
            if all(s.table(name) is None for s in run.samples):
                continue  # a table this revision does not have
            dead_ax.plot(
                minutes,
                [found.dead if (found := s.table(name)) else 0 for s in run.samples],
                style,
                color=colours[name],
                label=f"{run.label}: {name}",
            )
        size_ax.plot(
            minutes,
            [s.total_bytes / 2**20 for s in run.samples],
            style,
            color="black",
            label=f"{run.label} ({run.steady_per_s:,.0f} tasks/s)",
        )
    # A log scale: the two revisions' dead tuples differ several times over.
    dead_ax.set_yscale("log")
    dead_ax.set_ylabel("dead tuples (n_dead_tup, log scale)")
    dead_ax.set_title("Dead tuples, autovacuum at PostgreSQL's defaults, 70% of peak rate")
    dead_ax.legend(fontsize="small")
    dead_ax.grid(alpha=0.3)
    size_ax.set_ylabel("runifold_* tables, indexes and TOAST (MB)")
    size_ax.set_xlabel("minutes into the steady run")
    size_ax.legend(fontsize="small")
    size_ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def rows_of(run: Run) -> list[Row]:
    top = run.peak_dead()
    recent_ratio, recent = run.peak_dead_per_recent_task()
    rows = [
        Row(f"{run.label}: peak (pool of {PROCESSES}, backlog)", rate(run.peak_per_s, " tasks/s")),
        Row(
            f"{run.label}: steady rate achieved ({run.steady_s / 60:.0f} min)",
            f"{rate(run.steady_per_s, ' tasks/s')} ({run.samples[-1].unfinished:,} unfinished at the end)",
            f"{run.steady_per_s / run.peak_per_s:.2f}x peak",
            f"{STEADY_SHARE:.2f}x peak",
        ),
        Row(
            f"{run.label}: peak dead tuples, all runifold_* tables",
            f"{top.dead:,} at {top.t_s / 60:.1f} min",
        ),
        Row(f"{run.label}: peak dead tuples, {MAIN_TABLE}", f"{run.peak_table_dead(MAIN_TABLE):,}"),
        Row(
            f"{run.label}: peak dead tuples per task completed",
            f"{run.peak_dead_per_task():.3f}",
            f"{top.dead:,} / {top.completed:,}",
        ),
        Row(
            f"{run.label}: peak dead tuples per task completed in the minute before it",
            f"{recent_ratio:.2f}",
            f"{top.dead:,} / {recent:,}",
        ),
    ]
    window = f"{run.window_s() / 60:g} min"
    for measure, what, unit, scale in (
        ("dead", "dead tuples", "", 1.0),
        ("size", "total size", " MB", 2**20),
        ("per_task", "size a task stored", " B", 1.0),
    ):
        first, last = run.flatness(measure)
        ratio = last / first if first else float("inf")
        rows.append(
            Row(
                f"{run.label}: {what}, top of last {window} / first {window}",
                f"{first / scale:,.0f}{unit} -> {last / scale:,.0f}{unit}",
                f"{ratio:.2f}x",
                f"at most {FLAT_TARGET}x",
                ratio <= FLAT_TARGET,
            )
        )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--minutes", type=float, default=None, help="steady run (30; 3 with --quick)")
    parser.add_argument("--baseline-minutes", type=float, default=None, help="the baseline's (--minutes)")
    parser.add_argument("--baseline", default="cd3fa84", help="git revision, or none")
    parser.add_argument("--quick", action="store_true")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    parser.add_argument("--out", type=Path, default=HERE / "results" / f"dead_tuples-{stamp}.csv")
    parser.add_argument("--plot", type=Path, default=None, help="PNG (default: --out with .png)")
    parser.add_argument(
        "--from-csv", type=Path, help="print the table and draw --plot of an earlier run from its CSV"
    )
    args = parser.parse_args()
    if args.from_csv:
        runs = read_csv(args.from_csv)
        plot(args.plot or args.from_csv.with_suffix(".png"), runs)
        report(runs, f"from {args.from_csv.name}")
        return
    minutes = args.minutes or (3.0 if args.quick else 30.0)
    baseline_minutes = args.baseline_minutes or minutes
    peak_s = 30.0 if args.quick else 60.0
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="runifold-dead-tuples-") as scratch, private_cluster() as admin:
        runs = [Run(f"this tree ({head})", ROOT)]
        if args.baseline != "none":
            runs.append(Run(f"baseline {args.baseline}", export(args.baseline, Path(scratch))))
        for run in runs:
            measure_peak(run, admin, peak_s)
        for run in runs:
            measure_steady(
                run, admin, (minutes if run.tree == ROOT else baseline_minutes) * 60, args.out, runs
            )
    plot(args.plot or args.out.with_suffix(".png"), runs)
    progress(f"samples in {args.out}, plot in {args.plot or args.out.with_suffix('.png')}")
    for run in runs:
        if run.reloptions:
            progress(f"{run.label}: table options {run.reloptions}")
    report(runs, f"private cluster, {datetime.now(UTC):%Y-%m-%d}, {head}")


def report(runs: list[Run], where: str) -> None:
    rows = [row for run in runs for row in rows_of(run)]
    if len(runs) == 2:
        ours, base = runs
        ratio = ours.peak_dead_per_task() / base.peak_dead_per_task()
        rows.append(
            Row(
                f"peak dead tuples per task completed, {ours.label} / {base.label}",
                f"{ours.peak_dead_per_task():.3f} / {base.peak_dead_per_task():.3f}",
                f"{ratio:.2f}x",
                f"at most {PER_TASK_TARGET:.2f}x",
                ratio <= PER_TASK_TARGET,
            )
        )
        recent = ours.peak_dead_per_recent_task()[0] / base.peak_dead_per_recent_task()[0]
        rows.append(
            Row(
                "the same over the tasks completed in the minute before each peak",
                f"{ours.peak_dead_per_recent_task()[0]:.2f} / {base.peak_dead_per_recent_task()[0]:.2f}",
                f"{recent:.2f}x",
            )
        )
    print_table(
        f"Dead tuples and size, steady {STEADY_SHARE:.0%} of peak, autovacuum at its defaults ({where})", rows
    )


if __name__ == "__main__":
    main()
