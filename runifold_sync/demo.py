"""The ``demo`` command's workflow and drill: a worker is killed mid-step and another
worker with a new identity finishes its tasks without repeating completed steps.

Step bodies append to a ledger file outside the store, so the final table shows what
really ran, not what the store believes.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import attrs

from .checkpoint import Checkpoint
from .context import StepContext, WorkflowContext
from .definition import WorkflowDefinition, WorkflowRegistry
from .models import Budget, CapabilitySet, LeaseDuration, TaskState, WorkerId, WorkflowTask
from .outcomes import Idle
from .sqlite import SqliteWorkflowStore
from .store.base import TaskRecord
from .worker import WorkflowWorker
from .workflow import Workflow

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


def _ledger(ctx: StepContext) -> None:
    path = os.environ["RUNIFOLD_DEMO_LEDGER"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.task_id} {ctx.call_id} {os.getpid()}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _work(ctx: StepContext) -> None:
    _ledger(ctx)  # recorded when the body starts, so a body cut short still counts
    time.sleep(STEP_SECONDS)  # a slow downstream call: the window in which a worker dies


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
    return f"ch-{abs(hash(ctx.idempotency_key)) % 10**8:08d}"


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


STEPS_PER_ORDER = 4
FINISHED = ("completed", "failed", "cancelled")


def registry() -> WorkflowRegistry:
    reg = WorkflowRegistry()
    reg.register(WorkflowDefinition(order_intake, Budget(), CapabilitySet()))
    return reg


def _worker_process(db_path: str, worker_id: str, ledger: str) -> None:
    """Body of a demo worker process: opens its own store after it starts."""
    os.environ["RUNIFOLD_DEMO_LEDGER"] = ledger
    store = SqliteWorkflowStore.open(db_path)
    worker = WorkflowWorker(store, registry(), WorkerId.parse(worker_id), LEASE, HEARTBEAT)
    try:
        while True:
            if isinstance(worker.run_once(), Idle):
                time.sleep(0.05)
    finally:
        worker.close()
        store.close()


@attrs.frozen
class DemoRow:
    task_id: str
    state: str
    steps_done: int
    step_runs: int
    fencing_token: int
    last_worker: str | None


def run_demo(db_path: Path, orders: int, report: Callable[[str, list[DemoRow]], None]) -> list[DemoRow]:
    """Enqueue ``orders`` tasks, kill the first worker mid-step, recover with a second.
    ``report`` is called with a phase label and the current rows as things change."""
    ledger = db_path.with_suffix(".ledger")
    for path in (db_path, ledger, Path(f"{db_path}-wal"), Path(f"{db_path}-shm")):
        path.unlink(missing_ok=True)
    store = SqliteWorkflowStore.open(db_path)
    ids = [f"order-{n}" for n in range(1, orders + 1)]
    for n, task_id in enumerate(ids, 1):
        order = Order(task_id, 1000 * n)
        store.enqueue(WorkflowTask.new(order_intake.name, 1, order, checkpoint_id=task_id))
    spawn = multiprocessing.get_context("spawn")

    def rows() -> list[DemoRow]:
        runs = Counter(line.split()[0] for line in _read(ledger))
        return [_row(store.get_task(t), runs[t]) for t in ids]

    first = spawn.Process(target=_worker_process, args=(str(db_path), "demo-worker-1", str(ledger)))
    first.start()
    victim = ids[0]
    while True:  # kill worker 1 while it is inside the third step of the first order
        current = rows()
        report("worker 1 running", current)
        if current[0].steps_done >= 2 and current[0].step_runs >= 3:
            time.sleep(STEP_SECONDS / 2)
            break
        time.sleep(0.05)
    assert first.pid is not None
    os.kill(first.pid, signal.SIGKILL)
    first.join()
    report(f"worker 1 killed (SIGKILL) in the middle of a step of {victim}", rows())
    second = spawn.Process(target=_worker_process, args=(str(db_path), "demo-worker-2", str(ledger)))
    second.start()
    try:
        deadline = time.monotonic() + 60 + orders * 10
        while time.monotonic() < deadline:
            current = rows()
            report("worker 2 recovering after the lease expired", current)
            if all(r.state in FINISHED for r in current):
                break
            time.sleep(0.2)
    finally:
        assert second.pid is not None
        os.kill(second.pid, signal.SIGTERM)
        second.join()
    final = rows()
    store.close()
    return final


def _read(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _row(record: TaskRecord, step_runs: int) -> DemoRow:
    state = record.state.value if record.state is not TaskState.TERMINAL else str(record.outcome)
    steps = 0
    if record.checkpoint_json:
        checkpoint = Checkpoint.decode(record.task_id, record.checkpoint_json)
        steps = sum(1 for e in checkpoint.journal if e.kind != "timer" and e.status == "done")
    return DemoRow(record.task_id, state, steps, step_runs, record.fencing_token, record.worker_id)
