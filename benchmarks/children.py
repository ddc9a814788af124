"""The cost of a child workflow: workflows/s of a parent that starts 10 one-step children
and waits for them all, against a workflow of the same 10 steps run in one task, on both
stores, in the same run (the ratio is the child's overhead: each child is a task of its
own, enqueued, claimed, completed, and each end wakes the parent, whose claim replays its
journal). One worker in this process drives ``run_once`` until every task is done, as a
plain script would.

``python benchmarks/children.py [--quick]``.
"""

from __future__ import annotations

import time
from datetime import timedelta

from common import Row, arg_parser, fresh_store, print_table, progress, retry_on_restart

from runifold_sync import (
    LeaseDuration,
    StepContext,
    WorkerId,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowRegistry,
    WorkflowStore,
    WorkflowTask,
    WorkflowWorker,
    open_store,
)
from runifold_sync.store import TaskState

FAN_OUT = 10
LABELS = {"sqlite": "SQLite FULL", "postgres": "PostgreSQL"}

parent_flow = Workflow("bench-parent", 1)
child_flow = Workflow("bench-child", 1)
steps_flow = Workflow("bench-ten-steps", 1)


@child_flow.step()
def child_step(ctx: StepContext, value: int) -> int:
    return value + 1


@child_flow.main
def run_child(ctx: WorkflowContext, value: int) -> int:
    return child_step(ctx, value)


@parent_flow.main
def run_parent(ctx: WorkflowContext, children: int) -> int:
    handles = [ctx.start_child("bench-child", 1, n) for n in range(children)]
    results = ctx.wait_children(handles, result_type=int)
    assert isinstance(results, list)
    return sum(results)


@steps_flow.step()
def one_step(ctx: StepContext, value: int) -> int:
    return value + 1


@steps_flow.main
def run_steps(ctx: WorkflowContext, steps: int) -> int:
    return sum(one_step(ctx, n) for n in range(steps))


def _worker(store: WorkflowStore) -> WorkflowWorker:
    registry = WorkflowRegistry()
    for flow in (parent_flow, child_flow, steps_flow):
        registry.register(WorkflowDefinition(flow))
    lease = LeaseDuration(timedelta(minutes=10))
    return WorkflowWorker(store, registry, WorkerId.parse("bench-children"), lease, timedelta(minutes=1))


@retry_on_restart
def workflows_per_s(kind: str, name: str, workflows: int) -> float:
    """``workflows`` tasks of ``name`` (each given FAN_OUT), run to the end by one worker."""
    with fresh_store(kind) as url:
        store = open_store(url)
        worker = _worker(store)
        try:
            for _ in range(workflows):
                store.enqueue(WorkflowTask.new(name, 1, FAN_OUT))
            started = time.perf_counter()
            while True:
                outcome = worker.run_once()
                if outcome.kind == "failed":
                    raise RuntimeError(f"a {name} task failed: {outcome}")
                if outcome.kind == "idle" and all(s.state is TaskState.TERMINAL for s in store.queue_stats()):
                    break
            return workflows / (time.perf_counter() - started)
        finally:
            worker.close()
            store.close()


def run(quick: bool) -> list[Row]:
    workflows = 20 if quick else 100
    rows = []
    for kind in ("sqlite", "postgres"):
        progress(f"children: {kind}, {workflows} parents of {FAN_OUT} children, then as {FAN_OUT} steps")
        parents = workflows_per_s(kind, "bench-parent", workflows)
        inline = workflows_per_s(kind, "bench-ten-steps", workflows)
        rows.append(
            Row(
                f"{LABELS[kind]}, 1 process: a parent waiting for {FAN_OUT} one-step children",
                f"{parents:,.1f} workflows/s ({inline:,.1f} as {FAN_OUT} steps of one workflow)",
                f"{parents / inline:.2f}x the same work as steps",
                ">= 0.40x the same work as steps",
                parents / inline >= 0.4,
            )
        )
    return rows


def main() -> None:
    parser = arg_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="20 parents instead of 100")
    args = parser.parse_args()
    print_table("child workflows", run(args.quick))


if __name__ == "__main__":
    main()
