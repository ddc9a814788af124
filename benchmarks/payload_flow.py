"""A benchmark workflow whose steps return an object of about 5.6 KB (a page of 100
items, as an API call might answer), where ``bench-flow``'s return an integer: what a
step output's encoding and copying cost. A module of its own, which ``ab.py --cpu``
imports from the running checkout into both revisions' workers, so an older revision is
measured on the same workflow."""

from __future__ import annotations

from typing import Any

from runifold_sync import StepContext, Workflow, WorkflowContext, WorkflowTask

NAME = "bench-payload"
flow = Workflow(NAME, 1)


@flow.step()
def listing(ctx: StepContext, page: int) -> dict[str, Any]:
    items = [
        {"id": page * 100 + n, "name": f"item {n}", "price": n * 1.5, "tags": ["a", "b"]} for n in range(100)
    ]
    return {"page": page, "items": items}


@flow.main
def run_pages(ctx: WorkflowContext, steps: int) -> int:
    """``steps`` steps, each returning a page."""
    return sum(len(listing(ctx, page)["items"]) for page in range(steps))


def tasks(count: int, steps: int) -> list[WorkflowTask]:
    return [WorkflowTask.new(NAME, 1, steps) for _ in range(count)]
