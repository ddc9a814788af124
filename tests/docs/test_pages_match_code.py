"""What the pages say of the code, checked against the code: ``registry.task`` shown with
every option a task takes, which way priority runs (as the claim orders it), every schema
version and every setting listed. The pages' examples run on their own
(tests/support/doc_examples.py); these are the statements no example can run."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

from runifold_sync import LeaseDuration, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.model.values import TaskOptions
from runifold_sync.settings import SETTING_NAMES

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
STEPS = " ".join((DOCS / "howto" / "steps-and-effects.md").read_text().split())


def test_registry_task_is_documented_with_every_option_a_task_takes() -> None:
    [signature] = re.findall(r"`registry\.task\(name, version, input, \*, ([^)]*)\)`", STEPS)
    assert [option.strip().rstrip("=") for option in signature.split(",")] == list(
        TaskOptions.__annotations__
    )


def test_the_steps_page_says_priority_runs_higher_first_as_the_claim_orders_it(store: WorkflowStore) -> None:
    assert (
        "`priority`, default 0, is claimed higher first: among one tenant's ready tasks the highest" in STEPS
    )
    assert "across tenants the claim takes turns first, every tenant's next task before any" in STEPS
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


def test_the_schema_page_lists_every_migration() -> None:
    migrations = ROOT / "runifold_sync" / "store" / "migrations"
    versions = {int(p.name[:4]) for p in migrations.glob("*/*.sql")}
    listed = {
        int(v) for v in re.findall(r"^\| (\d+) \|", (DOCS / "reference" / "schema.md").read_text(), re.M)
    }
    assert listed == versions


def test_the_settings_page_lists_every_setting() -> None:
    page = (DOCS / "reference" / "settings.md").read_text()
    assert [name for name in SETTING_NAMES if f"`{name}`" not in page] == []


def test_each_task_a_team_does_has_a_how_to_page() -> None:
    pages = {p.stem for p in (DOCS / "howto").glob("*.md")} - {"index"}
    assert {
        "steps-and-effects",
        "waits-signals-approvals",
        "children-results-events",
        "schedules",
        "routing-and-queues",
        "pause-cancel-retry",
        "step-timeouts",
        "retention",
        "enqueue-in-your-transaction",
        "django",
        "flask",
        "testing",
        "tracing",
        "metrics",
        "dashboard",
        "pgbouncer",
        "flow-control",
        "deploying",
        "fleet",
    } <= pages
