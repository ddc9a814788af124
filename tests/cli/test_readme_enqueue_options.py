"""The README's enqueue options: ``registry.task`` shown with every option a task takes
(``TaskOptions``, ``queue`` included), and which way priority runs, said as the claim
orders it (higher first within a tenant, turns across tenants first)."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.model.values import TaskOptions

ROOT = Path(__file__).resolve().parents[2]
README = " ".join((ROOT / "README.md").read_text().split())


def test_registry_task_is_documented_with_every_option_a_task_takes() -> None:
    [signature] = re.findall(r"`registry\.task\(name, version, input, \*, ([^)]*)\)`", README)
    assert [option.strip().rstrip("=") for option in signature.split(",")] == list(
        TaskOptions.__annotations__
    )


def test_the_readme_says_priority_runs_higher_first_as_the_claim_orders_it(store: WorkflowStore) -> None:
    assert (
        "`priority`, default 0, is claimed higher first: among one tenant's ready tasks the highest" in README
    )
    assert "across tenants the claim takes turns first, every tenant's next task before any" in README
    for task_id, tenant, priority in (
        ("low", "a", 1),
        ("high", "a", 5),
        ("middle", "a", 3),
        ("b-low", "b", -2),
    ):
        store.enqueue(
            WorkflowTask.new("orders", 1, None, checkpoint_id=task_id, tenant=tenant, priority=priority)
        )
    lease = LeaseDuration(timedelta(seconds=30))
    order = [c.lease.task_id for _ in range(4) for c in store.claim(WorkerId.parse("w1"), lease)]
    # a's best first; then b's only task (its turn comes before a's second); then a by priority
    assert order == ["high", "b-low", "middle", "low"]
