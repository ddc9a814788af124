"""The dashboard's repairs on SQLite and PostgreSQL: fork (from a step of the run; the
answer goes to the new task's page) and resume of a cancelled task, each refused without
the token (401) or the session's CSRF token (403), and audited with who and why."""

from __future__ import annotations

from html import unescape

from flask.testing import FlaskClient

from runifold_sync import WorkflowStore
from runifold_sync.store import TaskState

from .conftest import csrf_of, log_in
from .flows import Seeded


def test_fork_needs_the_token_and_the_csrf_token(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    csrf = csrf_of(client)
    form = {"csrf_token": csrf, "reason": "r", "from_step": "pack"}
    assert client.post(f"/tasks/{seeded.completed}/fork", data=form).status_code == 401
    log_in(client)
    assert (
        client.post(f"/tasks/{seeded.completed}/fork", data=form | {"csrf_token": "forged"}).status_code
        == 403
    )
    assert not [e for e in store.history(seeded.completed) if e.kind == "forked"]


def test_fork_from_the_task_page_goes_to_the_new_task(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    csrf = log_in(client, actor="carol")
    page = unescape(client.get(f"/tasks/{seeded.completed}").get_data(as_text=True))
    assert 'id="action-fork"' in page and 'name="from_step"' in page
    response = client.post(
        f"/tasks/{seeded.completed}/fork",
        data={"csrf_token": csrf, "reason": "<b>replay</b>", "from_step": "pack"},
    )
    assert response.status_code == 303
    [forked] = [e.detail["task"] for e in store.history(seeded.completed) if e.kind == "forked"]
    assert response.headers["Location"].endswith(f"/tasks/{forked}")
    assert store.get_task(forked).state is TaskState.QUEUED
    [event] = [e for e in store.history(forked) if e.kind == "forked_from"]
    assert event.detail == {
        "task": seeded.completed,
        "from_step": "pack",
        "actor": "carol",
        "reason": "<b>replay</b>",
    }
    shown = client.get(f"/tasks/{forked}").get_data(as_text=True)
    assert "<b>replay</b>" not in shown and "&lt;b&gt;replay&lt;/b&gt;" in shown  # escaped
    bad = client.post(
        f"/tasks/{seeded.completed}/fork", data={"csrf_token": csrf, "reason": "r", "from_step": "nope"}
    )
    assert bad.status_code == 400 and "recorded no call" in unescape(bad.get_data(as_text=True))


def test_resume_a_cancelled_task_from_its_page(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    csrf = log_in(client, actor="dave")
    store.cancel(seeded.waiting, "ops", "by mistake")
    page = client.get(f"/tasks/{seeded.waiting}").get_data(as_text=True)
    assert 'id="action-resume"' in page
    response = client.post(f"/tasks/{seeded.waiting}/resume", data={"csrf_token": csrf, "reason": "undo"})
    assert response.status_code == 303
    assert store.get_task(seeded.waiting).state is TaskState.QUEUED
    [event] = [e for e in store.history(seeded.waiting) if e.kind == "resumed"]
    assert event.detail == {"from": "cancelled", "actor": "dave", "reason": "undo"}
