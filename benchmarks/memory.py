"""Peak memory (``VmHWM`` in ``/proc/<pid>/status``) of a worker process after it ran
N 5-step workflows, and of a supervisor with 4 worker children (the parent and each
child; children share the parent's pages copy-on-write, so the sum of peaks overstates
real use: the sum of proportional set sizes, PSS, is printed beside it). The baseline is
a bare interpreter started the same way. ``python benchmarks/memory.py [--quick]``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from common import (
    Row,
    arg_parser,
    enqueue_workflows,
    fresh_store,
    print_table,
    progress,
    retry_on_restart,
    running_pool,
    wait_completed,
)

from runifold_sync import open_store

MB = 1024 * 1024


def _status_kb(pid: int | str, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(field)


def peak_bytes(pid: int) -> int:
    return _status_kb(pid, "VmHWM") * 1024


def pss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise KeyError("Pss")


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found.extend(int(c) for c in (task / "children").read_text().split())
    return found


def bare_interpreter_peak() -> int:
    probe = "import sys; sys.stdout.write(open('/proc/self/status').read())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@retry_on_restart
def pool_peaks(kind: str, processes: int, workflows: int) -> tuple[int, list[int], int]:
    """(supervisor peak, each child's peak, PSS of all) after the pool ran ``workflows``."""
    with fresh_store(kind) as url:
        store = open_store(url)
        try:
            enqueue_workflows(store, workflows, 5, delay=None)
            with running_pool(url, processes) as proc:
                wait_completed(store, workflows)
                kids = children(proc.pid)
                if len(kids) != processes:
                    raise RuntimeError(f"expected {processes} worker children, found {kids}")
                pss = pss_bytes(proc.pid) + sum(pss_bytes(k) for k in kids)
                return peak_bytes(proc.pid), [peak_bytes(k) for k in kids], pss
        finally:
            store.close()


def run(quick: bool) -> list[Row]:
    workflows = 100 if quick else 500
    bare = bare_interpreter_peak()
    rows = [Row("bare python interpreter: peak RSS", f"{bare / MB:.1f} MB", "baseline")]
    for kind, label in (("postgres", "PostgreSQL"), ("sqlite", "SQLite")):
        progress(f"memory: one worker, {label}, {workflows} workflows")
        _parent, (child,), _pss = pool_peaks(kind, 1, workflows)
        rows.append(
            Row(
                f"one worker process ({label}, after {workflows} workflows): peak RSS",
                f"{child / MB:.1f} MB",
                f"{child / bare:.1f}x bare python",
                "< 60 MB",
                child < 60 * MB,
            )
        )
    progress(f"memory: supervisor with 4 children, PostgreSQL, {workflows} workflows")
    parent, kids, pss = pool_peaks("postgres", 4, workflows)
    total = parent + sum(kids)
    rows.append(
        Row(
            "supervisor + 4 children (PostgreSQL): sum of peak RSS",
            f"{total / MB:.1f} MB",
            f"{total / bare:.1f}x bare python; supervisor {parent / MB:.1f} MB, "
            f"children {', '.join(f'{k / MB:.0f}' for k in kids)} MB",
        )
    )
    rows.append(
        Row(
            "supervisor + 4 children (PostgreSQL): sum of PSS",
            f"{pss / MB:.1f} MB",
            f"{pss / total:.2f}x sum of peaks (shared pages counted once)",
        )
    )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="100 workflows instead of 500")
    args = parser.parse_args()
    print_table("Memory", run(args.quick))


if __name__ == "__main__":
    main()
