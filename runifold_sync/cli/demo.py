"""The ``demo`` command's workflow and drill: a worker is killed mid-step and another
worker with a new identity finishes its tasks without repeating completed steps.

Step bodies append to a ledger file outside the store, so the final table shows what
really ran, not what the store believes. Each body writes a ``start`` line when it begins
and an ``end`` line when it is done; the drill kills a worker only while its body is
between the two, so exactly one step body runs twice.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import attrs

from ..model.cancellation import CancellationToken
from ..model.values import Budget, CapabilitySet, LeaseDuration, TaskState, WorkerId, WorkflowTask
from ..pool.preflight import first_incarnation
from ..pool.supervisor import WorkflowSupervisor, WorkflowSupervisorConfig
from ..store.base import WorkflowStore
from ..store.checkpoints import read_checkpoint
from ..store.open import open_store, sqlite_path
from ..store.records import TaskRecord
from ..worker.worker import WorkflowWorker
from ..workflow.context import WorkflowContext
from ..workflow.declaration import Workflow
from ..workflow.registry import WorkflowDefinition, WorkflowRegistry
from ..workflow.step_context import StepContext

STEP_SECONDS = 0.4
LEASE = LeaseDuration(timedelta(seconds=3))
HEARTBEAT = timedelta(seconds=1)

order_intake = Workflow("demo-order-intake", version=1)


@attrs.frozen
class Order:
    order_id: str
    amount_cents: int


@attrs.frozen
class Receipt:
    order_id: str
    charge_id: str
    shipment_id: str


def _ledger(ctx: StepContext, mark: str) -> None:
    path = os.environ["RUNIFOLD_DEMO_LEDGER"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.task_id} {ctx.call_id} {os.getpid()} {mark}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _work(ctx: StepContext) -> None:
    _ledger(ctx, "start")  # recorded when the body starts, so a body cut short still counts
    time.sleep(STEP_SECONDS)  # a slow downstream call: the window in which a worker dies
    _ledger(ctx, "end")


@order_intake.step()
def validate(ctx: StepContext, order: Order) -> Order:
    _work(ctx)
    return order


@order_intake.step()
def reserve_stock(ctx: StepContext, order: Order) -> str:
    _work(ctx)
    return f"res-{order.order_id}"


@order_intake.effect(idempotent=True)
def charge_card(ctx: StepContext, order: Order) -> str:
    # The idempotency key is what a payment API would deduplicate on.
    _work(ctx)
    assert ctx.idempotency_key is not None  # an effect always has one
    return charge_id(ctx.idempotency_key)


def charge_id(idempotency_key: str) -> str:
    """The charge a payment API would answer for ``idempotency_key``: the same in every
    process and on every attempt, as deduplication needs (Python's ``hash()`` of a string
    differs between processes)."""
    return f"ch-{hashlib.sha256(idempotency_key.encode()).hexdigest()[:12]}"


@order_intake.step()
def ship(ctx: StepContext, reservation: str) -> str:
    _work(ctx)
    return f"ship-{reservation}"


@order_intake.main
def run_order(ctx: WorkflowContext, order: Order) -> Receipt:
    checked = validate(ctx, order)
    reservation = reserve_stock(ctx, checked)
    charge = charge_card(ctx, checked)
    ctx.sleep(timedelta(seconds=1))  # a durable timer: the worker is free meanwhile
    shipment = ship(ctx, reservation)
    return Receipt(order.order_id, charge, shipment)


# What the table's "steps done" counts: the three steps and the effect (the timer is
# journalled too, and not counted).
STEPS_PER_ORDER = 4
FINISHED = ("completed", "failed", "cancelled")


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(order_intake, Budget(), CapabilitySet()))
    return reg


def _pool_process(url: str, ledger: str, concurrency: int) -> None:
    """Body of the demo's supervisor process; each forked worker opens its own store."""
    os.environ["RUNIFOLD_DEMO_LEDGER"] = ledger
    logging.getLogger("runifold_sync").setLevel(logging.ERROR)  # the demo narrates instead

    def factory(worker_id: WorkerId) -> WorkflowWorker:
        return WorkflowWorker(open_store(url), registry(), worker_id, LEASE, HEARTBEAT)

    config = WorkflowSupervisorConfig(concurrency).with_backoff(
        timedelta(milliseconds=20), timedelta(milliseconds=200)
    )
    WorkflowSupervisor(factory, config, base_id="demo-worker").run(CancellationToken())


@attrs.frozen
class DemoRow:
    task_id: str
    state: str
    steps_done: int
    step_runs: int
    fencing_token: int
    last_worker: str | None


@attrs.frozen
class DemoResult:
    rows: list[DemoRow]
    killed: str | None  # "pid P in CALL of TASK", or None if no worker was killed


def _fresh_start(url: str) -> tuple[Path, str, Path | None]:
    """The ledger path, the task id prefix and the scratch directory (removed at the
    end) of a new run. A SQLite store is replaced (with the ledger beside it); another
    store keeps its tasks, so this run's get ids of their own and a ledger in a new
    temporary directory."""
    if url.startswith("sqlite:"):
        db_path = Path(sqlite_path(url))
        ledger = db_path.with_suffix(".ledger")
        for path in (db_path, ledger, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
            path.unlink(missing_ok=True)
        return ledger, "order", None
    scratch = Path(tempfile.mkdtemp(prefix="runifold-demo-"))
    return scratch / "demo.ledger", f"order-{uuid.uuid4().hex[:6]}", scratch


def run_demo(
    url: str, orders: int, concurrency: int, report: Callable[[str, list[DemoRow]], None]
) -> DemoResult:
    """Enqueue ``orders`` tasks on the store ``url`` names, run a supervised pool, SIGKILL
    one worker in the middle of a step and let the pool recover. ``report`` gets a phase
    label and the rows."""
    ledger, prefix, scratch = _fresh_start(url)
    store = open_store(url)
    ids = [f"{prefix}-{n}" for n in range(1, orders + 1)]
    for n, task_id in enumerate(ids, 1):
        order = Order(task_id, 1000 * n)
        store.enqueue(WorkflowTask.new(order_intake.name, 1, order, checkpoint_id=task_id))

    def rows() -> list[DemoRow]:
        runs = Counter(task for task, _call, _pid, mark in _read(ledger) if mark == "start")
        return [_row(store, store.get_task(t), runs[t]) for t in ids]

    report(f"{orders} orders enqueued", rows())
    pool = multiprocessing.get_context("spawn").Process(
        target=_pool_process, args=(url, str(ledger), concurrency)
    )
    pool.start()
    try:
        phase = f"pool of {concurrency} worker processes running"
        killed: str | None = None
        victim: tuple[str, int] | None = None  # worker id and pid of the killed worker
        deadline = time.monotonic() + 60 + orders * 10
        while time.monotonic() < deadline:
            current = rows()
            if victim is not None and (replacement := _replacement(store, *victim)) is not None:
                phase = f"slot restarted as pid {replacement}; recovering"
                victim = None
            report(phase, current)
            if all(r.state in FINISHED for r in current):
                break
            if not killed and current[0].steps_done >= 2 and (hit := _kill_mid_step(ledger)):
                # Two steps of the first order are committed: a worker dies mid-step.
                task_id, call_id, pid = hit
                # (the latest registration with that pid: another store may hold old runs)
                worker = max((w for w in store.workers() if w.pid == pid), key=lambda w: w.started_at)
                victim = (worker.worker_id, pid)
                killed = f"pid {pid} in {call_id} of {task_id}"
                # Said once, as it happens: the progress that follows (other workers go
                # on while the slot restarts) is reported under the next phase.
                report(f"SIGKILLed {killed}", current)
                phase = f"waiting for the slot of pid {pid} to restart"
            time.sleep(0.1)
    finally:
        assert pool.pid is not None
        os.kill(pool.pid, signal.SIGTERM)  # graceful: started cycles finish first
        pool.join()
    final = rows()
    store.close()
    if scratch is not None:
        shutil.rmtree(scratch)
    return DemoResult(final, killed)


def _read(path: Path) -> list[tuple[str, str, int, str]]:
    """The ledger's lines as (task id, call id, pid, "start" or "end")."""
    if not path.exists():
        return []
    return [(t, c, int(p), m) for t, c, p, m in (line.split() for line in path.read_text().splitlines())]


def _in_flight(ledger: Path) -> list[tuple[str, str, int]]:
    """Step bodies that started and have not ended, in the order they started."""
    lines = _read(ledger)
    ended = {(t, c, p) for t, c, p, mark in lines if mark == "end"}
    return [(t, c, p) for t, c, p, mark in lines if mark == "start" and (t, c, p) not in ended]


def _kill_mid_step(ledger: Path) -> tuple[str, str, int] | None:
    """SIGKILL the worker running the most recently started step body, or return None
    when no body is in flight. Checking the ledger and then killing would race with the
    body's end, so the worker is first stopped (SIGSTOP): once it is, its body cannot
    end, and the ledger says for sure whether the kill lands mid-step. If the body ended
    first, the worker is resumed (SIGCONT) and the caller tries again later."""
    in_flight = _in_flight(ledger)
    if not in_flight:
        return None
    hit = in_flight[-1]
    os.kill(hit[2], signal.SIGSTOP)
    _wait_stopped(hit[2])
    if hit in _in_flight(ledger):
        os.kill(hit[2], signal.SIGKILL)
        return hit
    os.kill(hit[2], signal.SIGCONT)
    return None


def _wait_stopped(pid: int) -> None:
    """Wait until ``pid`` is stopped: a signal takes effect when the process next leaves
    the kernel, so a write it is in the middle of may still land. Linux shows the state
    in /proc; elsewhere a short sleep stands in."""
    stat = Path(f"/proc/{pid}/stat")
    if not stat.exists():
        time.sleep(0.1)
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        except FileNotFoundError:
            return  # it died
        time.sleep(0.002)


def _replacement(store: WorkflowStore, worker_id: str, killed_pid: int) -> int | None:
    """The pid of the process that registered in the slot of ``worker_id`` after
    ``killed_pid`` (the supervisor restarts a slot under a new incarnation of its id,
    ``<worker id>.1``), or None while there is none."""
    slot = first_incarnation(worker_id)
    for worker in store.workers():
        if (
            first_incarnation(worker.worker_id) == slot
            and worker.pid != killed_pid
            and worker.stopped_at is None
        ):
            return worker.pid
    return None


def _row(store: WorkflowStore, record: TaskRecord, step_runs: int) -> DemoRow:
    state = record.state.value if record.state is not TaskState.TERMINAL else str(record.outcome)
    steps = 0
    checkpoint = read_checkpoint(store, record.task_id)
    if checkpoint is not None:
        steps = sum(1 for e in checkpoint.journal if e.kind != "timer" and e.status == "done")
    return DemoRow(record.task_id, state, steps, step_runs, record.fencing_token, record.worker_id)
