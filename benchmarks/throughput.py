"""Workflow throughput: N workflows of K trivial steps (defaults N=500, K=5) drained by a
supervised pool, on SQLite (``synchronous=FULL``) with 1 worker process and on
PostgreSQL with 1, 2 and 4, each figure also as a fraction of the single-connection
commit limit measured in the same run. SQLite with 1 process and PostgreSQL with 4 are
measured again with the library's default claim size (``claim_batch="auto"``: one task
a claim, growing up to ten while the queue is deep and tasks are short) and with
``claim_batch=10`` (ten workflows a claim, their completions held for one commit with
the next claim), each against one task per claim (the default before ``auto``): what
adaptive claims and the fixed setting buy workflows of short steps. ``--steps 1`` makes
the one-step tasks of the queue comparisons.

The time is store time from the first claim to the last completion (history events);
tasks are enqueued due 1.5 s ahead so every worker is up and idle when they become due.
Each figure is the best of 2 runs taken in turns.
``python benchmarks/throughput.py [--workflows N] [--steps K] [--quick]``.
"""

from __future__ import annotations

import os

from commit_limit import CommitLimits, measure_limits
from common import (
    QUICK_WORKFLOWS,
    WORKFLOWS,
    Row,
    Throughput,
    arg_parser,
    measure_fresh,
    print_table,
    progress,
    rate,
)

# (store, processes, claim batch: None for the library's default); the targets are one
# task per claim's.
CONFIGS: tuple[tuple[str, int, int | None], ...] = (
    ("sqlite", 1, 1),
    ("postgres", 1, 1),
    ("postgres", 2, 1),
    ("postgres", 4, 1),
    ("sqlite", 1, None),
    ("postgres", 4, None),
    ("sqlite", 1, 10),
    ("postgres", 4, 10),
)
LABELS = {"sqlite": "SQLite FULL", "postgres": "PostgreSQL"}
Config = tuple[str, int, int | None]


ROUNDS = 2


def commits_per_workflow(steps: int) -> int:
    """A commit for each step but the last, and the completion that carries the last
    step's result and claims the next workflow (a pool's workers claim on completion)."""
    return steps


def measure(workflows: int, steps: int) -> dict[Config, Throughput]:
    """The best of ``ROUNDS`` measurements of each configuration, taken in turns: other
    load on the machine only ever lowers a figure."""
    results: dict[Config, Throughput] = {}
    for turn in range(1, ROUNDS + 1):
        for kind, processes, batch in CONFIGS:
            progress(
                f"throughput: {LABELS[kind]}, {processes} process(es), claim batch {batch}, "
                f"{workflows}x{steps} steps, round {turn} of {ROUNDS}"
            )
            result = measure_fresh(
                kind, workflows=workflows, steps=steps, processes=processes, claim_batch=batch
            )
            best = results.get((kind, processes, batch))
            if best is None or result.seconds < best.seconds:
                results[kind, processes, batch] = result
    return results


def rows_for(results: dict[Config, Throughput], limits: CommitLimits) -> list[Row]:
    rows = []
    for (kind, processes, batch), result in results.items():
        limit = limits.sqlite if kind == "sqlite" else limits.postgres_1
        fraction = result.steps_per_s / limit
        name = f"{LABELS[kind]}, {processes} proc, {result.workflows}x{result.steps}-step workflows"
        if batch != 1:
            single = results[kind, processes, 1]
            rows.append(
                Row(
                    f"{name}, {result.claims}: steps/s",
                    rate(result.steps_per_s),
                    f"{result.steps_per_s / single.steps_per_s:.2f}x one task per claim (the default "
                    f"before auto); {fraction:.2f}x {LABELS[kind]} commit limit (1 conn)",
                )
            )
            continue
        target, met = "", None
        if (kind, processes) == ("sqlite", 1) and result.steps == 5:
            target, met = ">= 0.6x commit limit", fraction >= 0.6
        rows.append(
            Row(
                f"{name}: steps/s",
                rate(result.steps_per_s),
                f"{fraction:.2f}x {LABELS[kind]} commit limit (1 conn)",
                target,
                met,
            )
        )
        rows.append(
            Row(
                f"{name}: workflows/s",
                rate(result.workflows_per_s),
                f"{result.workflows_per_s * commits_per_workflow(result.steps) / limit:.2f}x limit in "
                f"commits ({commits_per_workflow(result.steps)} per workflow)",
            )
        )
        if result.cpu is not None:
            rows.append(cpu_row(name, result))
    return rows


def cpu_row(name: str, result: Throughput) -> Row:
    """How busy the machine's cores were while the pool drained, and what that makes per
    step: when the cores are saturated, CPU per step is what bounds steps/s."""
    assert result.cpu is not None
    cores = os.cpu_count() or 1
    per_step_us = result.cpu.us_per(result.steps_per_s)
    server = ""
    if result.cpu.server_s is not None:
        server = f", {result.cpu.server_s / result.cpu.busy_s:.0%} of it in PostgreSQL"
    return Row(
        f"{name}: CPU while draining (whole machine)",
        f"{result.cpu.busy_cores:.2f} of {cores} cores",
        f"{per_step_us:,.0f} µs CPU per step{server}; at this cost {cores} saturated cores "
        f"make {cores * 1e6 / per_step_us:,.0f} steps/s",
    )


Results = dict[Config, Throughput]


def run(quick: bool, limits: CommitLimits | None = None) -> tuple[Results, list[Row]]:
    workflows = QUICK_WORKFLOWS if quick else WORKFLOWS
    if limits is None:
        limits = measure_limits(3.0 if quick else 9.0)
    results = measure(workflows, 5)
    return results, rows_for(results, limits)


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--workflows", type=int, default=WORKFLOWS)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_WORKFLOWS} workflows")
    args = parser.parse_args()
    limits = measure_limits(3.0 if args.quick else 9.0)
    workflows = QUICK_WORKFLOWS if args.quick else args.workflows
    results = measure(workflows, args.steps)
    print_table("Workflow throughput", rows_for(results, limits))


if __name__ == "__main__":
    main()
