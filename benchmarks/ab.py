"""Interleaved A/B of two revisions of this repository: the throughput of 5-step
workflows drained by a supervised pool (SQLite with 1 process, PostgreSQL with 4, as
``throughput.py`` measures them), each revision measured in turn, round after round, the
order reversed every other round, so that a drift of the machine's speed falls on both.
Prints every run and, per figure, the mean of each side and the ratio after/before.

``python benchmarks/ab.py BEFORE AFTER [--rounds 3] [--workflows 300]``: BEFORE and AFTER
are git revisions (``HEAD``, a commit, a branch), each exported with ``git archive``
into a temporary directory and run with its own ``benchmarks/common.py`` and package, on
the interpreter (and installed dependencies) running this script.

With ``--cpu`` each turn is instead the CPU per step of one in-process worker (the
worker's own, and the PostgreSQL server's), for 5-step workflows and for one-step tasks,
on both stores (``cpu_per_step.measure_worker``); the table gives each side's median,
since a noisy machine only ever adds to a CPU figure in a few runs, and lower is better.

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
from statistics import mean, median

from common import ROOT, Row, arg_parser, print_table, progress

FIGURES = {"sqlite1": ("sqlite", 1), "postgres4": ("postgres", 4)}
_MEASURE = """
import json, sys
from common import measure_fresh
workflows = int(sys.argv[1])
figures = {}
for name, (kind, processes) in json.loads(sys.argv[2]).items():
    figures[name] = measure_fresh(kind, workflows=workflows, steps=5, processes=processes).steps_per_s
print(json.dumps(figures))
"""
_MEASURE_CPU = """
import json
from common import fresh_store
from cpu_per_step import measure_worker
figures = {}
for kind in ("sqlite", "postgres"):
    for steps, workflows in ((5, 200), (1, 600)):
        with fresh_store(kind) as url:
            result = measure_worker(url, workflows=workflows, steps=steps)
        shape = f"{kind}, {steps}-step workflows"
        figures[f"{shape}: worker CPU per step"] = result.cpu_us_per_step
        if result.server_s is not None:
            figures[f"{shape}: server CPU per step"] = result.server_s / result.steps * 1e6
print(json.dumps(figures))
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


def measure(tree: Path, workflows: int, *, cpu: bool = False) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'benchmarks'}")
    script = [_MEASURE_CPU] if cpu else [_MEASURE, str(workflows), json.dumps(FIGURES)]
    done = subprocess.run(
        [sys.executable, "-c", *script],
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


def _compare_cpu(
    before: list[dict[str, float]], after: list[dict[str, float]], names: tuple[str, str]
) -> None:
    rows = []
    for figure in before[0]:
        b = median(run[figure] for run in before)
        a = median(run[figure] for run in after)
        rows.append(Row(figure, f"{b:,.0f} µs -> {a:,.0f} µs", f"{a / b:.2f}x"))
    title = f"CPU per step A/B, {names[0]} -> {names[1]}, medians of {len(before)} rounds interleaved"
    print_table(title, rows)


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
        for turn in range(1, args.rounds + 1):
            # ABBA order: a machine that speeds up or slows down over the run favours
            # neither side.
            order = list(trees.items()) if turn % 2 else list(reversed(trees.items()))
            for rev, tree in order:
                progress(f"ab: round {turn} of {args.rounds}, {rev}")
                if args.run_all:
                    runs[rev].append(measure_run_all(tree))
                else:
                    runs[rev].append(measure(tree, args.workflows, cpu=args.cpu))
                print(
                    f"round {turn} {rev}: " + ", ".join(f"{k} {v:,.0f}" for k, v in runs[rev][-1].items()),
                    flush=True,
                )
    if args.run_all:
        _compare_run_all(runs[args.before], runs[args.after], (args.before, args.after))
        return
    if args.cpu:
        _compare_cpu(runs[args.before], runs[args.after], (args.before, args.after))
        return
    rows = []
    for name in FIGURES:
        before = [run[name] for run in runs[args.before]]
        after = [run[name] for run in runs[args.after]]
        rows.append(
            Row(
                f"{name}: 5-step workflows, steps/s ({args.before} -> {args.after})",
                f"{mean(before):,.0f}/s -> {mean(after):,.0f}/s",
                f"{mean(after) / mean(before):.2f}x (runs {', '.join(f'{v:,.0f}' for v in before)} -> "
                f"{', '.join(f'{v:,.0f}' for v in after)})",
            )
        )
    print_table(f"A/B, {args.rounds} rounds interleaved", rows)


if __name__ == "__main__":
    main()
