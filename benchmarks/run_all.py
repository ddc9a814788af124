"""Every benchmark in one run and one table: commit limit, workflow throughput, peers,
idle pickup latency, result latency, server connections killed under a pool, claims at
scale, memory, CPU per step, a one-step task's cost by layer, workflow length, retention
and the dashboard's pages, with each ratio taken against a baseline measured in this
same run and each target of the performance issue marked met or NOT MET.

``python benchmarks/run_all.py --quick`` (small N, a few minutes) or without ``--quick``
for the full sizes (N=500 workflows, 2,000 one-step tasks, 200 latency samples).
Progress goes to stderr; the table to stdout.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import backend_kills
import children
import commit_limit
import cpu_per_step
import dashboard
import journal_length
import latency
import memory
import peers
import prune
import psycopg
import scale
import stale_statistics
import task_cost
import throughput
import wait_latency
from common import PG_ADMIN_URL, Row, admin_connection, arg_parser, not_measured, print_table, progress

# 1 throughput, 4 peers, 3 latency, 2 result latency, 7 backend-kill, 4 scale, 1
# stale-statistics, 2 memory, 1 CPU per step, 5 workflow-length, 2 retention and 14
# dashboard rows carry a target.
EXPECTED_TARGETS = 46


def _environment() -> str:
    with admin_connection() as conn:
        row = conn.execute("SELECT current_setting('server_version'), current_setting('synchronous_commit')")
        version, sync = row.fetchone() or ("?", "?")
    return (
        f"Python {platform.python_version()}, PostgreSQL {version} (synchronous_commit={sync}) "
        f"at {psycopg.conninfo.conninfo_to_dict(PG_ADMIN_URL).get('host')}, {os.cpu_count()} CPUs"
    )


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="small N so the whole run takes a few minutes")
    args = parser.parse_args()
    started = time.monotonic()
    sections: list[tuple[str, list[Row]]] = []

    def section(title: str, measure: Callable[[], list[Row]]) -> None:
        """One section's rows; a section that fails entirely is reported, not fatal."""
        try:
            sections.append((title, measure()))
        except Exception as exc:  # the run goes on; the table says what is missing
            progress(f"{title} failed: {type(exc).__name__}: {exc}")
            failed = not_measured(title, f"{type(exc).__name__}: {exc}", target="its targets")
            sections.append((title, [failed]))

    limits: commit_limit.CommitLimits | None = None

    def limit_rows() -> list[Row]:
        nonlocal limits
        limits, rows = commit_limit.run(args.quick)
        return rows

    def throughput_rows() -> list[Row]:
        return throughput.run(args.quick, limits)[1]

    section("commit limit", limit_rows)
    section("workflow throughput (5 trivial steps)", throughput_rows)
    section("peers (ratio: runifold_sync / peer)", lambda: peers.run(args.quick))
    section("idle pickup latency", lambda: latency.run(args.quick))
    section("result latency (completion to wait_for_task)", lambda: wait_latency.run(args.quick))
    section("server connections killed under a pool (PostgreSQL)", lambda: backend_kills.run(args.quick))
    section("child workflows", lambda: children.run(args.quick))
    section("claim throughput at scale", lambda: scale.run(args.quick))
    section("claims on statistics older than the backlog", lambda: stale_statistics.run(args.quick))
    section("memory", lambda: memory.run(args.quick))
    section("CPU per step", lambda: cpu_per_step.run(args.quick))
    section("one-step task cost (PostgreSQL, 1 process)", lambda: task_cost.run(args.quick))
    section("workflow length", lambda: journal_length.run(args.quick))
    section("retention (PostgreSQL)", lambda: prune.run(args.quick))
    section("dashboard server time (p95; ratio: to the first page's)", lambda: dashboard.run(args.quick))

    table: list[Row] = []
    for title, rows in sections:
        table.append(Row(f"[{title}]", ""))
        table.extend(rows)
    targets = [r for r in table if r.target]
    met = sum(1 for r in targets if r.met)
    elapsed_s = time.monotonic() - started
    mode = "--quick" if args.quick else "full"
    print_table(f"runifold_sync benchmarks ({mode}; {_environment()}; {elapsed_s:.0f} s)", table)
    measured = [r for r in targets if r.met is not None]
    print(f"targets met: {met} of {len(measured)} measured ({EXPECTED_TARGETS} targets in the table)")
    for row in targets:
        if not row.met:
            print(f"  {row.status}: {row.figure} = {row.value} ({row.ratio}; target {row.target})")
    progress(f"done in {elapsed_s:.0f} s")


if __name__ == "__main__":
    main()
