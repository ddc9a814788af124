"""Peers, side by side with runifold_sync in one run on the same machine and server:

- DBOS, the same workflow shape (N workflows of K trivial steps) on a SQLite file in WAL
  mode with 1 process, and on PostgreSQL with 1 and 4 processes;
- pgqueuer and procrastinate, one-step tasks (enqueue M, drain with 4 processes), against
  runifold_sync one-step workflows drained by a pool of 4.

The peers are installed from PyPI into their own virtualenv (``benchmarks/.peers``,
created on first use) and each runs in its own subprocesses (``peer_*.py``): workers
connect, say ready, and start together on ``go``; the span is from the earliest start to
the last job recorded as done. Each comparison runs twice, interleaved, and each side
keeps its fastest run. A peer that cannot be installed or run is reported as "not
measured" with its error. ``python benchmarks/peers.py [--quick]``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from common import (
    HERE,
    QUICK_WORKFLOWS,
    WORKFLOWS,
    CpuMeter,
    CpuUse,
    Row,
    Throughput,
    arg_parser,
    fresh_postgres,
    fresh_sqlite,
    measure_fresh,
    measure_pool,
    not_measured,
    print_table,
    progress,
    rate,
    retry_on_restart,
)

PEERS_DIR = HERE / ".peers"
PYTHON = PEERS_DIR / "bin" / "python"
# pgqueuer dequeues 10 jobs per round trip by default; runifold_sync is measured with one
# task per claim (its default) and with this batch, and the better one is compared.
CLAIM_BATCH = 10
# A single run of either side of a comparison moved by 10% with the machine's other load,
# enough to flip a target either way; the fastest of this many interleaved runs is kept.
ROUNDS = 2
# One-step tasks per run, --quick too: with fewer, the peers' start-up (not their
# throughput) decided the figure, and a quick run showed pgqueuer at half its full speed.
ONE_STEP_TASKS = 2000
REQUIREMENTS = {"dbos": "dbos", "pgqueuer": "pgqueuer[asyncpg]", "procrastinate": "procrastinate"}


class PeerFailed(RuntimeError):
    """A peer could not be installed or run; the message says why."""


def _tail(text: str, lines: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:]) or "(no output)"


def install_peers() -> dict[str, str]:
    """Create the virtualenv if needed and install each peer; returns the installed
    version of each peer, or raises nothing: a failure is recorded as ``!error``."""
    versions = {}
    if not PYTHON.exists():
        progress(f"peers: creating {PEERS_DIR}")
        made = subprocess.run([sys.executable, "-m", "venv", str(PEERS_DIR)], capture_output=True, text=True)
        if made.returncode != 0:
            return {name: f"!virtualenv: {_tail(made.stderr)}" for name in REQUIREMENTS}
    for name, requirement in REQUIREMENTS.items():
        probe = f"import importlib.metadata as m, {name}; print(m.version({name!r}))"
        found = subprocess.run([str(PYTHON), "-c", probe], capture_output=True, text=True)
        if found.returncode != 0:
            progress(f"peers: pip install {requirement}")
            pip = [str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", requirement]
            installed = subprocess.run(pip, capture_output=True, text=True)
            if installed.returncode != 0:
                versions[name] = f"!pip install {requirement}: {_tail(installed.stderr)}"
                continue
            found = subprocess.run([str(PYTHON), "-c", probe], capture_output=True, text=True)
        ok = found.returncode == 0
        versions[name] = found.stdout.strip() if ok else f"!import {name}: {_tail(found.stderr)}"
    return versions


@dataclass(frozen=True)
class PeerRun:
    seconds: float
    done: int
    info: dict[str, object]
    cpu: CpuUse | None = None  # the machine's, from the first worker's start to the last one's end

    @property
    def per_s(self) -> float:
        return self.done / self.seconds


def _json_line(text: str) -> dict[str, object]:
    result: dict[str, object] = json.loads(text.strip().splitlines()[-1])
    return result


def run_peer(script: str, url: str, *, processes: int, count: int, extra: list[str]) -> PeerRun:
    """``setup`` once, then ``processes`` workers started together; raises PeerFailed."""
    path = str(HERE / script)
    setup = subprocess.run(
        [str(PYTHON), path, "setup", "--url", url, "--count", str(count), *extra],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if setup.returncode != 0:
        raise PeerFailed(f"{script} setup: {_tail(setup.stderr)}")
    meter = CpuMeter(with_server=url.startswith("postgresql"))
    with tempfile.TemporaryDirectory(prefix="runifold-peer-") as tmp, meter:
        logs = [Path(tmp) / f"worker-{i}.log" for i in range(processes)]
        workers = []
        for i, log in enumerate(logs):
            argv = [path, "work", "--url", url, "--index", str(i), "--processes", str(processes)]
            workers.append(
                subprocess.Popen(
                    [str(PYTHON), *argv, "--count", str(count), *extra],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log.open("w"),
                    text=True,
                )
            )
        try:
            for worker, log in zip(workers, logs, strict=True):
                assert worker.stdout is not None
                if worker.stdout.readline().strip() != "ready":
                    worker.wait(timeout=30)
                    raise PeerFailed(f"{script} worker did not start: {_tail(log.read_text())}")
            for worker in workers:
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            results = []
            for worker, log in zip(workers, logs, strict=True):
                out, _ = worker.communicate(timeout=600)
                if worker.returncode != 0:
                    raise PeerFailed(f"{script} worker exited {worker.returncode}: {_tail(log.read_text())}")
                results.append(_json_line(out))
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()
    start = min(float(str(r["start"])) for r in results)
    end = max(float(str(r["end"])) for r in results)
    done = sum(int(str(r["done"])) for r in results)
    if done != count:
        raise PeerFailed(f"{script}: {done} of {count} jobs ran")
    info = {k: v for k, v in results[0].items() if k not in ("start", "end", "done")}
    return PeerRun(end - start, done, info, meter.between(start, end))


@retry_on_restart
def measure_dbos(kind: str, processes: int, workflows: int, steps: int) -> PeerRun:
    extra = ["--steps", str(steps)]
    if kind == "sqlite":
        with fresh_sqlite() as url:
            return run_peer("peer_dbos.py", url, processes=processes, count=workflows, extra=extra)
    with fresh_postgres() as url:
        return run_peer("peer_dbos.py", url, processes=processes, count=workflows, extra=extra)


@retry_on_restart
def measure_queue(script: str, processes: int, tasks: int) -> PeerRun:
    with fresh_postgres() as url:
        return run_peer(script, url, processes=processes, count=tasks, extra=[])


@retry_on_restart
def measure_unflushed(tasks: int) -> Throughput:
    """One-step tasks on a database whose commits return before their WAL is flushed.
    Not a setting runifold_sync would run on (a server crash can lose a completion it
    reported); it shows how much of the durable figure is waiting for those flushes."""
    with fresh_postgres({"synchronous_commit": "off"}) as url:
        return measure_pool(url, workflows=tasks, steps=1, processes=4, claim_batch=CLAIM_BATCH)


def _dbos_row(kind: str, processes: int, goal: float | None, workflows: int, version: str) -> Row:
    label = "SQLite WAL" if kind == "sqlite" else "PostgreSQL"
    figure = f"DBOS, {label}, {processes} proc, {workflows}x5-step workflows: steps/s"
    target = "" if goal is None else f"runifold_sync >= {goal:g}x"
    if version.startswith("!"):
        return not_measured(figure, version[1:], target)
    mine, peer = [], []
    try:
        for round_ in range(1, ROUNDS + 1):
            progress(
                f"peers: runifold_sync, {label}, {processes} process(es), {workflows}x5 steps, round {round_}"
            )
            mine.append(measure_fresh(kind, workflows=workflows, steps=5, processes=processes).steps_per_s)
            progress(f"peers: DBOS {version}, {label}, {processes} process(es), round {round_}")
            last = measure_dbos(kind, processes, workflows, 5)
            peer.append(workflows * 5 / last.seconds)
    except (PeerFailed, subprocess.TimeoutExpired) as exc:
        return not_measured(figure, str(exc), target)
    ratio = max(mine) / max(peer)
    note = f" ({last.info['sqlite']})" if "sqlite" in last.info else ""
    return Row(
        figure + note,
        rate(max(peer)),
        f"runifold_sync {ratio:.2f}x ({rate(max(mine))})",
        target,
        None if goal is None else ratio >= goal,
    )


def _cpu_us(cpu: CpuUse | None, per_s: float) -> str:
    return "?" if cpu is None else f"{cpu.us_per(per_s):,.0f} µs"


def _one_step_rows(tasks: int, versions: dict[str, str]) -> list[Row]:
    """runifold_sync one-step tasks (one per claim, and claimed in batches), the same
    batched on a database without flush waits, and the queue peers, round by round;
    each keeps its fastest run, and the machine's CPU per task in that run."""
    queues = {
        "pgqueuer": ("peer_pgqueuer.py", 1.0),
        "procrastinate": ("peer_procrastinate.py", 2.0),
    }
    single: list[Throughput] = []
    batched: list[Throughput] = []
    unflushed: list[Throughput] = []
    peer: dict[str, list[PeerRun]] = {name: [] for name in queues}
    failed = {name: versions[name][1:] for name in queues if versions[name].startswith("!")}
    for round_ in range(1, ROUNDS + 1):
        progress(f"peers: runifold_sync one-step workflows, 4 processes, {tasks} tasks, round {round_}")
        single.append(measure_fresh("postgres", workflows=tasks, steps=1, processes=4, claim_batch=1))
        batched.append(
            measure_fresh("postgres", workflows=tasks, steps=1, processes=4, claim_batch=CLAIM_BATCH)
        )
        unflushed.append(measure_unflushed(tasks))
        for name, (script, _goal) in queues.items():
            if name in failed:
                continue
            progress(
                f"peers: {name} {versions[name]}, PostgreSQL, 4 processes, {tasks} tasks, round {round_}"
            )
            try:
                peer[name].append(measure_queue(script, 4, tasks))
            except (PeerFailed, subprocess.TimeoutExpired) as exc:
                failed[name] = str(exc)
    fastest = max(single + batched, key=lambda run: run.workflows_per_s)
    one, ten, off = (max(runs, key=lambda run: run.workflows_per_s) for runs in (single, batched, unflushed))
    mode = fastest.claims
    rows = [
        Row(
            f"runifold_sync, PostgreSQL, 4 proc, {tasks} one-step tasks: tasks/s",
            rate(one.workflows_per_s),
            f"one task per claim; {rate(ten.workflows_per_s)} with claim batch {CLAIM_BATCH}",
        ),
        Row(
            "  the same, machine CPU per task while draining (server included)",
            _cpu_us(fastest.cpu, fastest.workflows_per_s),
            f"{mode}; {_cpu_us(off.cpu, off.workflows_per_s)} with synchronous_commit=off",
        ),
        Row(
            "  diagnostic: the same with synchronous_commit=off (not durable, no target)",
            rate(off.workflows_per_s),
            f"{off.workflows_per_s / ten.workflows_per_s:.2f}x claim batch {CLAIM_BATCH}: "
            "the cost of waiting for each completion's WAL flush",
        ),
    ]
    for name, (_script, goal) in queues.items():
        figure = f"{name}, PostgreSQL, 4 proc, {tasks} one-step tasks: tasks/s"
        target = f"runifold_sync >= {goal:g}x"
        if name in failed:
            rows.append(not_measured(figure, failed[name], target))
            continue
        best = max(peer[name], key=lambda run: run.per_s)
        per_s = best.per_s
        ratio = fastest.workflows_per_s / per_s
        rows.append(
            Row(
                figure,
                rate(per_s),
                f"runifold_sync {ratio:.2f}x ({rate(fastest.workflows_per_s)}, {mode}); machine CPU per "
                f"task {_cpu_us(best.cpu, per_s)} against runifold_sync's "
                f"{_cpu_us(fastest.cpu, fastest.workflows_per_s)}",
                target,
                ratio >= goal,
            )
        )
    return rows


def run(quick: bool) -> list[Row]:
    """Each side of a comparison is measured ROUNDS times, interleaved (runifold_sync,
    then the peer, then again), so both see the same load on the machine; each keeps
    its fastest run."""
    workflows = QUICK_WORKFLOWS if quick else WORKFLOWS
    versions = install_peers()
    rows = [
        not_measured(f"peer {name}", v[1:]) if v.startswith("!") else Row(f"peer {name}", v, "in .peers")
        for name, v in versions.items()
    ]
    for kind, processes, goal in (("sqlite", 1, 8.0), ("postgres", 1, None), ("postgres", 4, 8.0)):
        rows.append(_dbos_row(kind, processes, goal, workflows, versions["dbos"]))
    return rows + _one_step_rows(ONE_STEP_TASKS, versions)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument(
        "--quick", action="store_true", help=f"{QUICK_WORKFLOWS} workflows instead of {WORKFLOWS}"
    )
    args = parser.parse_args()
    print_table("Peers (ratios: runifold_sync / peer, same run)", run(args.quick))


if __name__ == "__main__":
    main()
