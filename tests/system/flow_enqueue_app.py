"""One enqueue with a flow option, or a batch of tasks without (``bulk``), for the crash
tests of ``test_flow_crash_points``: run with ``RUNIFOLD_CRASH_AT=flow_enqueue:<key>`` (or
``bulk_enqueue``) it is killed inside its transaction."""

from __future__ import annotations

import argparse
from datetime import timedelta

from runifold_sync import WorkflowTask, open_store

WINDOW = timedelta(minutes=10)


def task(kind: str, task_id: str, value: int) -> WorkflowTask:
    """The task a ``kind`` case enqueues: debounced on "doc", or a singleton of "sync"
    replacing the key's task."""
    if kind == "debounce":
        return WorkflowTask.new(
            "orders", 1, {"v": value}, checkpoint_id=task_id, debounce=WINDOW, debounce_key="doc"
        )
    return WorkflowTask.new(
        "orders", 1, {"v": value}, checkpoint_id=task_id, dedup_key="sync", singleton=True, replace=True
    )


BULK_SIZE = 16


def batch(first_id: str, value: int) -> list[WorkflowTask]:
    """A ``bulk`` case's batch: ``first_id`` and then ``first_id-1`` and on, no flow options."""
    ids = [first_id] + [f"{first_id}-{n}" for n in range(1, BULK_SIZE)]
    return [WorkflowTask.new("orders", 1, {"v": value}, checkpoint_id=task_id) for task_id in ids]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--kind", required=True, choices=["bulk", "debounce", "singleton"])
    parser.add_argument("--task-id", required=True)
    parser.add_argument("--value", type=int, required=True)
    args = parser.parse_args()
    with open_store(args.url) as store:
        if args.kind == "bulk":
            store.enqueue_many(batch(args.task_id, args.value))
        else:
            store.enqueue(task(args.kind, args.task_id, args.value))


if __name__ == "__main__":
    main()
