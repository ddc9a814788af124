"""Interleaved A/B of two revisions of this repository: the throughput of 5-step
workflows drained by a supervised pool (SQLite with 1 process, PostgreSQL with 4, as
``throughput.py`` measures them) and of one-step tasks (PostgreSQL, 4 processes, claim
batch 10, five times as many: the shape of the pgqueuer comparison), and of both with
each revision's own default claim size (no ``claim_batch`` given: comparing a revision
before ``claim_batch="auto"`` with one after compares the defaults), each revision
measured in turn, round after round, the order reversed every other round, so that a
drift of the machine's speed falls on both.
Prints every run and, per figure, the mean of each side and the ratio after/before.

``python benchmarks/ab.py BEFORE AFTER [--rounds 3] [--workflows 300]``: BEFORE and AFTER
are git revisions (``HEAD``, a commit, a branch), each exported with ``git archive``
into a temporary directory and run with its own ``benchmarks/common.py`` and package, on
the interpreter (and installed dependencies) running this script.

With ``--cpu`` the two revisions instead run side by side, each a process with one
in-process worker per shape (5-step workflows and one-step tasks, on both stores; the
one-step tasks also at claim batch 10 through the worker loop a pool child runs), in
lockstep: a block of tasks on one side, then the same block on the other, first one side
then the other, ``4 x --rounds`` blocks. The table gives each side's CPU per step (its
worker's, and the PostgreSQL server's) over all blocks: on a machine whose speed swings
by minutes, runs a minute apart differed by more than the changes being measured.

With ``--run-all`` each turn is instead each revision's own ``run_all.py --quick``, and
every figure both tables have is compared by its value's first number: higher is better
for a rate (``/s``), lower for everything else (latency, CPU, memory). A figure more than
10% worse is marked NOT MET.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from statistics import mean

from common import HERE, ROOT, Row, arg_parser, print_table, progress, server_cpu_s

# name -> store, processes, steps per workflow, claim batch, what the figure is
FIGURES = {
    "sqlite1": ("sqlite", 1, 5, 1, "5-step workflows, steps/s"),
    "postgres4": ("postgres", 4, 5, 1, "5-step workflows, steps/s"),
    "postgres4_one_step": ("postgres", 4, 1, 10, "one-step tasks, claim batch 10, tasks/s"),
    # Each revision's own default claim size (no claim_batch given): 1 before "auto".
    "postgres4_one_step_default": ("postgres", 4, 1, None, "one-step tasks, default claims, tasks/s"),
    "sqlite1_default": ("sqlite", 1, 5, None, "5-step workflows, default claims, steps/s"),
}
_MEASURE = """
import json, sys
from common import measure_fresh
workflows = int(sys.argv[1])
figures = {}
for name, (kind, processes, steps, batch, _what) in json.loads(sys.argv[2]).items():
    claims = {} if batch is None else {"claim_batch": batch}
    figures[name] = measure_fresh(
        kind, workflows=workflows * 5 // steps, steps=steps, processes=processes, **claims
    ).steps_per_s
print(json.dumps(figures))
"""
# One revision's side of ``--cpu`` for one shape: a worker on its own fresh store with
# every block's tasks enqueued up front; it runs a block whenever the driver sends a line
# and answers with its CPU time, so two revisions can run block for block in lockstep.
_CPU_SIDE = """
import json, sys, time
from datetime import timedelta
from common import enqueue_workflows, fresh_store, registry
from runifold_sync import (CancellationToken, LeaseDuration, WorkerId, WorkflowDefinition,
                           WorkflowWorker, open_store)
(kind, steps, per_block, batch, pages), blocks = json.loads(sys.argv[1]), int(sys.argv[2])
sys.path.append(sys.argv[3])  # this checkout's benchmarks, for payload_flow
import payload_flow
served = registry()
if pages:  # only for its shapes: the others serve the definitions they always served
    served.register(WorkflowDefinition(payload_flow.flow))
with fresh_store(kind) as url, open_store(url) as store:
    if pages:
        store.enqueue_many(payload_flow.tasks(per_block * blocks + 1, steps))
    else:
        enqueue_workflows(store, per_block * blocks + 1, steps, delay=None)
    worker = WorkflowWorker(store, served, WorkerId.parse("ab"), LeaseDuration(timedelta(seconds=60)),
                            timedelta(seconds=10), claim_batch=batch)
    worker.run_once(claim_next=True)  # warm up: connections, prepared statements
    print("ready", flush=True)
    for _ in sys.stdin:
        cpu0 = time.process_time()
        if batch > 1:  # the loop a pool child runs (a block's tasks, then the rest handed back)
            worker.run(CancellationToken(), max_tasks=per_block)
        else:
            for _ in range(per_block):
                worker.run_once(claim_next=True)
        print(time.process_time() - cpu0, flush=True)
    worker.close()
"""


def export(revision: str, into: Path) -> Path:
    """The files of ``revision`` under ``into``."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], capture_output=True, check=True)
    tree = into / revision.replace("/", "_")
    tree.mkdir()
    with tempfile.TemporaryFile() as tar:
        tar.write(archive.stdout)
        tar.seek(0)
        with tarfile.open(fileobj=tar) as files:
            files.extractall(tree, filter="data")
    return tree


def measure(tree: Path, workflows: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'benchmarks'}")
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(workflows), json.dumps(FIGURES)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"measuring {tree.name} failed: {done.stderr[-2000:]}")
    figures: dict[str, float] = json.loads(done.stdout.splitlines()[-1])
    return figures


def measure_run_all(tree: Path) -> dict[str, float]:
    """The first number of each value in ``tree``'s ``run_all.py --quick`` tables."""
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'benchmarks'}")
    done = subprocess.run(
        [sys.executable, "benchmarks/run_all.py", "--quick"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"run_all in {tree.name} failed: {done.stderr[-2000:]}")
    figures = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        number = re.search(r"\d[\d,]*(?:\.\d+)?", cells[1]) if len(cells) == 5 else None
        if number is not None and cells[0] != "figure":
            figures[f"{cells[0]} [{_unit(cells[1])}]"] = float(number.group().replace(",", ""))
    return figures


def _unit(value: str) -> str:
    found = re.search(r"\d[\d,.]*\s*([^\s(;,]+)", value)
    return found.group(1) if found else ""


def _compare_run_all(
    before: list[dict[str, float]], after: list[dict[str, float]], names: tuple[str, str]
) -> None:
    rows = []
    for figure in sorted(set(before[0]).intersection(after[0])):
        b = mean(run[figure] for run in before if figure in run)
        a = mean(run[figure] for run in after if figure in run)
        higher_is_better = "/s" in figure.rsplit("[", 1)[1]
        change = (a / b if higher_is_better else b / a) if a and b else 1.0
        rows.append(
            Row(
                figure,
                f"{b:,.4g} -> {a:,.4g}",
                f"{change:.2f}x as good",
                "at least 0.90x",
                change >= 0.9,
            )
        )
    print_table(f"run_all --quick A/B, {names[0]} -> {names[1]}, {len(before)} rounds interleaved", rows)


# name -> store, steps per workflow, tasks per block, claim batch, steps returning 5.6 KB
# objects (payload_flow) rather than integers
CPU_SHAPES = {
    "SQLite, 5-step workflows": ("sqlite", 5, 60, 1, False),
    "SQLite, 5-step workflows, 5.6 KB step outputs": ("sqlite", 5, 20, 1, True),
    "SQLite, one-step tasks": ("sqlite", 1, 150, 1, False),
    "SQLite, one-step tasks, claim batch 10": ("sqlite", 1, 150, 10, False),
    "PostgreSQL, 5-step workflows": ("postgres", 5, 60, 1, False),
    "PostgreSQL, 5-step workflows, 5.6 KB step outputs": ("postgres", 5, 20, 1, True),
    "PostgreSQL, one-step tasks": ("postgres", 1, 150, 1, False),
    "PostgreSQL, one-step tasks, claim batch 10": ("postgres", 1, 150, 10, False),
}


def lockstep_cpu(trees: dict[str, Path], blocks: int) -> list[Row]:
    """Both revisions' workers (``_CPU_SIDE``) started together and run block for block,
    alternating which goes first, so a slow minute of the machine falls on both; the
    server's CPU is read around each block (the other side is idle meanwhile)."""
    sides = {}
    for rev, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'benchmarks'}")
        for name, shape in CPU_SHAPES.items():
            # A process per shape: its CPU time is then its own worker's, threads included.
            sides[rev, name] = subprocess.Popen(
                [sys.executable, "-c", _CPU_SIDE, json.dumps(shape), str(blocks), str(HERE)],
                cwd=tree,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
    spent = {key: [0.0, 0.0] for key in sides}
    try:
        for (rev, name), side in sides.items():
            assert side.stdout is not None
            if side.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{rev}: the CPU worker of {name} did not start (exit {side.wait()})")
        for block in range(blocks):
            progress(f"ab --cpu: block {block + 1} of {blocks}")
            order = list(trees) if block % 2 == 0 else list(reversed(trees))
            for name in CPU_SHAPES:
                for rev in order:
                    side = sides[rev, name]
                    assert side.stdin is not None and side.stdout is not None
                    server0 = server_cpu_s()
                    side.stdin.write("\n")
                    side.stdin.flush()
                    worker_s = float(side.stdout.readline())
                    server1 = server_cpu_s()
                    spent[rev, name][0] += worker_s
                    if server0 is not None and server1 is not None and CPU_SHAPES[name][0] == "postgres":
                        spent[rev, name][1] += server1 - server0
    finally:
        for side in sides.values():
            side.kill()
            side.wait()
    before, after = trees
    rows = []
    for name, (kind, steps, per_block, _batch, _pages) in CPU_SHAPES.items():
        units = steps * per_block * blocks
        for part, label in ((0, "worker"), (1, "server")):
            if part and kind != "postgres":
                continue
            b, a = (spent[rev, name][part] / units * 1e6 for rev in (before, after))
            rows.append(Row(f"{name}: {label} CPU per step", f"{b:,.0f} µs -> {a:,.0f} µs", f"{a / b:.2f}x"))
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=300)
    parser.add_argument("--run-all", action="store_true", help="compare whole run_all.py --quick tables")
    parser.add_argument("--cpu", action="store_true", help="compare CPU per step of an in-process worker")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {args.before: [], args.after: []}
    with tempfile.TemporaryDirectory(prefix="runifold-ab-") as scratch:
        trees = {rev: export(rev, Path(scratch)) for rev in runs}
        if args.cpu:
            rows = lockstep_cpu(trees, args.rounds * 4)
            print_table(
                f"CPU per step A/B, {args.before} -> {args.after}, {args.rounds * 4} blocks in lockstep", rows
            )
            return
        for turn in range(1, args.rounds + 1):
            # ABBA order: a machine that speeds up or slows down over the run favours
            # neither side.
            order = list(trees.items()) if turn % 2 else list(reversed(trees.items()))
            for rev, tree in order:
                progress(f"ab: round {turn} of {args.rounds}, {rev}")
                runs[rev].append(measure_run_all(tree) if args.run_all else measure(tree, args.workflows))
                print(
                    f"round {turn} {rev}: " + ", ".join(f"{k} {v:,.0f}" for k, v in runs[rev][-1].items()),
                    flush=True,
                )
    if args.run_all:
        _compare_run_all(runs[args.before], runs[args.after], (args.before, args.after))
        return
    rows = []
    for name, (*_shape, what) in FIGURES.items():
        before = [run[name] for run in runs[args.before]]
        after = [run[name] for run in runs[args.after]]
        rows.append(
            Row(
                f"{name}: {what} ({args.before} -> {args.after})",
                f"{mean(before):,.0f}/s -> {mean(after):,.0f}/s",
                f"{mean(after) / mean(before):.2f}x (runs {', '.join(f'{v:,.0f}' for v in before)} -> "
                f"{', '.join(f'{v:,.0f}' for v in after)})",
            )
        )
    print_table(f"A/B, {args.rounds} rounds interleaved", rows)


if __name__ == "__main__":
    main()
