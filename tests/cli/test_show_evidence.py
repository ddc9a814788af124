"""How each effect's result became known, as ``show`` tells it: run, found applied or not
applied by its reconcile, resolved by an operator either way. ``show --json`` gives the
journal as structured entries, the text output and the dashboard's task page say it in
words."""

from __future__ import annotations

import json
from collections.abc import Iterator
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from runifold_sync import (
    EffectEvidence,
    StepContext,
    Workflow,
    WorkflowContext,
    WorkflowDefinition,
    WorkflowTask,
)
from runifold_sync.cli.main import main
from runifold_sync.dashboard import create_app
from runifold_sync.outcomes import Completed, Failed
from runifold_sync.sqlite import SqliteWorkflowStore
from tests.support.clock import Clock
from tests.support.workers import WorkerFactory

CRASH_ONCE: set[str] = set()  # effects whose next call dies mid-call


class _Crash(BaseException):
    """Kills the claim inside an effect, as a worker's death would."""


@pytest.fixture(autouse=True)
def _crashes() -> Iterator[None]:
    CRASH_ONCE.update({"found", "missing", "asked", "asked_again"})
    yield
    CRASH_ONCE.clear()


def _body(name: str) -> Any:
    def body(ctx: StepContext) -> str:
        if name in CRASH_ONCE:
            CRASH_ONCE.discard(name)
            raise _Crash()
        return f"{name} done"

    return body


flow = Workflow("evidence", 1)
plain = flow.effect("plain", idempotent=False)(_body("plain"))
found = flow.effect(
    "found", idempotent=False, reconcile=lambda ctx: EffectEvidence.applied("found by reconcile")
)(_body("found"))
missing = flow.effect("missing", idempotent=False, reconcile=lambda ctx: EffectEvidence.not_applied())(
    _body("missing")
)
asked = flow.effect("asked", idempotent=False)(_body("asked"))
asked_again = flow.effect("asked_again", idempotent=False)(_body("asked_again"))


@flow.main
def run_all(ctx: WorkflowContext, _input: None) -> list[str]:
    return [plain(ctx), found(ctx), missing(ctx), asked(ctx), asked_again(ctx)]


@pytest.fixture
def url(sqlite_path: Path, sqlite_store: SqliteWorkflowStore, make_worker: WorkerFactory) -> str:
    """The store of one task whose effects were each settled another way: plain ran,
    found and missing were reconciled (applied, not applied), asked and asked_again were
    resolved by operators (applied, not applied)."""
    clock = Clock(sqlite_store)
    worker = make_worker(WorkflowDefinition(flow))
    sqlite_store.enqueue(WorkflowTask.new("evidence", 1, None, checkpoint_id="t1"))
    for _ in range(3):  # dies in found, in missing, in asked
        with pytest.raises(_Crash):
            worker.run_once()
        clock.advance(31)  # the dead claim's lease runs out
    assert isinstance(worker.run_once(), Failed)  # asked: ambiguous
    key = "t1/asked#1"
    sqlite_store.resolve_effect(
        "t1", key, applied=True, result_json='"asked done"', actor="ops: eu", reason="seen: in the ledger"
    )
    with pytest.raises(_Crash):  # dies in asked_again
        worker.run_once()
    clock.advance(31)
    assert isinstance(worker.run_once(), Failed)
    sqlite_store.resolve_effect(
        "t1", "t1/asked_again#1", applied=False, result_json=None, actor="bob", reason="no charge"
    )
    done = worker.run_once()
    assert done == Completed(
        "t1", ["plain done", "found by reconcile", "missing done", "asked done", "asked_again done"]
    )
    return f"sqlite:///{sqlite_path}"


def _show(url: str, *options: str) -> str:
    result = CliRunner().invoke(main, ["show", "t1", "--database", url, *options], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_show_json_gives_each_journal_entry_with_its_evidence(url: str) -> None:
    journal = json.loads(_show(url, "--json"))["journal"]

    def evidence(how: str, applied: bool | None, by: str | None, reason: str | None, text: str) -> Any:
        return {"how": how, "applied": applied, "by": by, "reason": reason, "text": text}

    assert journal == [
        {"id": "plain#1", "kind": "effect", "status": "done", "key": "t1/plain#1",
         "evidence": evidence("ran", None, None, None, "ran")},
        {"id": "found#1", "kind": "effect", "status": "done", "key": "t1/found#1",
         "evidence": evidence("reconciled", True, None, None, "reconciled")},
        {"id": "missing#1", "kind": "effect", "status": "done", "key": "t1/missing#1",
         "evidence": evidence("reconciled", False, None, None, "re-run as not applied, reconciled")},
        {"id": "asked#1", "kind": "effect", "status": "done", "key": "t1/asked#1",
         "evidence": evidence("resolved", True, "ops: eu", "seen: in the ledger",
                              "resolved by ops: eu: seen: in the ledger")},
        {"id": "asked_again#1", "kind": "effect", "status": "done", "key": "t1/asked_again#1",
         "evidence": evidence("resolved", False, "bob", "no charge",
                              "re-run as not applied, resolved by bob: no charge")},
    ]  # fmt: skip


EXPECTED_LINES = [
    "plain#1 (effect, done)",
    "found#1 (effect, done): reconciled as applied",
    "missing#1 (effect, done): reconciled as not applied; run again",
    "asked#1 (effect, done): resolved as applied by ops: eu (seen: in the ledger)",
    "asked_again#1 (effect, done): resolved as not applied by bob (no charge); run again",
]


def test_show_says_which_effects_were_reconciled_or_resolved(url: str) -> None:
    lines = _show(url).splitlines()
    start = lines.index("run 1, journal of 5 entries, all shown:") + 1

    assert [line.strip() for line in lines[start : start + 5]] == EXPECTED_LINES


def test_the_dashboards_task_page_says_it_too(url: str, sqlite_store: SqliteWorkflowStore) -> None:
    page = create_app(sqlite_store, token="test-token-7d1f").test_client().get("/tasks/t1")
    assert page.status_code == 200
    text = unescape(page.get_data(as_text=True))

    assert all(f"<summary>{line}</summary>" in text for line in EXPECTED_LINES)
