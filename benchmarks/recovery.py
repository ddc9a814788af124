"""Recovery after a worker's SIGKILL: the time from the kill to its task's next claim.

A supervised pool of 2 workers with a 30 s lease (the library's default; heartbeat 10 s)
runs one task at a time whose only step sleeps until the benchmark lets it return. Each
round enqueues a task, waits until a child is inside its step, SIGKILLs that child (the
holder named in the worker registry) and reads the task's history: the figure is the
store time of the next claim minus the wall time of the kill (one clock on this host).
The supervisor reaps the child and the one it forks in the slot hands the lease back, so
the next claim does not wait for the lease to run out. The baseline, measured in the same
run, is the same kill of a worker that no supervisor watches (two plain
``WorkflowWorker.run`` processes): there the task waits out the lease.

    python benchmarks/recovery.py [--store sqlite|postgres] [--kills 20] [--baseline-kills 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from common import HERE, ROOT, Row, arg_parser, fresh_store, print_table, progress

from runifold_sync import (
    CancellationToken,
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowSupervisor,
    WorkflowSupervisorConfig,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)

LEASE = LeaseDuration(timedelta(seconds=30))
HEARTBEAT = timedelta(seconds=10)
POOL_SIZE = 2
RELEASE_DIR_ENV = "RECOVERY_RELEASE_DIR"  # a step returns once <dir>/<task id> exists

held = Workflow("recovery-held", 1)


@held.step()
def hold(ctx: StepContext, label: str) -> str:
    release = Path(os.environ[RELEASE_DIR_ENV]) / ctx.task_id
    while not release.exists():
        time.sleep(0.05)
    return label


@held.main
def run_held(ctx: WorkflowContext, label: str) -> str:
    return hold(ctx, label)


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(held))
    return reg


def _worker(url: str, worker_id: WorkerId) -> WorkflowWorker:
    return WorkflowWorker(open_store(url), registry(), worker_id, LEASE, HEARTBEAT)


def serve(url: str, supervised: bool, worker_id: str) -> None:
    """The process a round runs: a supervised pool, or one plain worker (the baseline)."""
    token = CancellationToken()
    if supervised:
        config = WorkflowSupervisorConfig(POOL_SIZE).with_backoff(
            timedelta(milliseconds=25), timedelta(seconds=1)
        )
        WorkflowSupervisor(lambda wid: _worker(url, wid), config, base_id=worker_id).run(token)
        return
    signal.signal(signal.SIGTERM, lambda _s, _f: token.cancel())
    worker = _worker(url, WorkerId.parse(worker_id))
    try:
        worker.run(token, min_backoff=timedelta(milliseconds=25), max_backoff=timedelta(seconds=1))
    finally:
        worker.close()
        worker.store.close()


@contextmanager
def started(url: str, release_dir: Path, supervised: bool) -> Iterator[None]:
    """A supervised pool, or ``POOL_SIZE`` plain workers, in processes of their own."""
    names = ["recovery"] if supervised else [f"plain-{n}" for n in range(POOL_SIZE)]
    env = os.environ | {RELEASE_DIR_ENV: str(release_dir)}
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "recovery.py"), "--serve", url, "--worker-id", name]
            + (["--supervised"] if supervised else []),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
        for name in names
    ]
    try:
        yield
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout_s:.0f} s")
        time.sleep(0.005)


def kill_and_time(store: WorkflowStore, release_dir: Path, task_id: str) -> float:
    """Enqueue ``task_id``, SIGKILL the worker running its step, and return the seconds
    from the kill to the task's next claim; then let the task finish."""
    store.enqueue(WorkflowTask.new("recovery-held", 1, task_id, checkpoint_id=task_id))
    _wait(lambda: store.get_task(task_id).worker_id is not None, 60, f"{task_id} claimed")
    time.sleep(0.3)  # inside its step, past the claim's own commit
    holder = store.get_task(task_id).worker_id
    [pid] = [w.pid for w in store.workers() if w.worker_id == holder]
    token = store.get_task(task_id).fencing_token
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    _wait(
        lambda: store.get_task(task_id).fencing_token > token, LEASE.seconds * 3, f"{task_id} claimed again"
    )
    [claim] = [e for e in store.history(task_id) if e.kind == "claimed" and e.fencing_token == token + 1]
    (release_dir / task_id).touch()
    return claim.at.timestamp() - killed_at


def measure(kind: str, supervised: bool, kills: int) -> list[float]:
    with fresh_store(kind) as url, tempfile.TemporaryDirectory(prefix="runifold-recovery-") as tmp:
        release_dir = Path(tmp)
        store = open_store(url)
        try:
            with started(url, release_dir, supervised):
                _wait(lambda: len(store.workers()) >= POOL_SIZE, 60, "the workers registered")
                times = []
                for n in range(kills):
                    took = kill_and_time(store, release_dir, f"{'pool' if supervised else 'plain'}-{n}")
                    progress(f"{'supervised' if supervised else 'plain'} kill {n + 1}/{kills}: {took:.3f} s")
                    times.append(took)
                return times
        finally:
            store.close()


def run(kind: str, kills: int, baseline_kills: int) -> list[Row]:
    lease_s = LEASE.seconds
    pool = measure(kind, True, kills)
    p50 = statistics.median(pool)
    rows = [
        Row(
            f"SIGKILL -> next claim, supervised pool of {POOL_SIZE}, lease {lease_s:.0f} s ({kind}): p50",
            f"{p50:.3f} s",
            f"{p50 / lease_s:.3f}x the lease",
            "< 1 s",
            p50 < 1.0,
        ),
        Row("  max of those kills", f"{max(pool):.3f} s", f"{len(pool)} kills"),
    ]
    if baseline_kills:
        plain = statistics.median(measure(kind, False, baseline_kills))
        rows.append(
            Row(
                "baseline: SIGKILL -> next claim, unsupervised workers",
                f"{plain:.3f} s",
                f"pool p50 {p50 / plain:.3f}x this; {plain / lease_s:.2f}x the lease",
            )
        )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--baseline-kills", type=int, default=1, help="0 skips the baseline (30 s each)")
    # What a round's own processes are started with.
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    parser.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.supervised, args.worker_id)
        return
    print_table("Recovery after a SIGKILL", run(args.store, args.kills, args.baseline_kills))


if __name__ == "__main__":
    main()
