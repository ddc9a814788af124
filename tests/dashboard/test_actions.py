"""The dashboard's actions on SQLite and PostgreSQL: each needs the token (a bearer header,
or a login session with its CSRF token: else 401, and 403 without the CSRF token),
records the actor and the reason in the task's history, and a read-only dashboard
refuses every POST."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape
from typing import Any
from urllib.parse import urljoin, urlsplit

import flask
import pytest
from flask.testing import FlaskClient

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.dashboard import create_app
from runifold_sync.store import TaskState

from .conftest import TOKEN, csrf_of, log_in
from .flows import Seeded


def said(response: Any) -> str:
    """A response's text as a reader sees it (entities unescaped)."""
    return unescape(response.get_data(as_text=True))


ACTIONS = ["cancel", "retry", "pause", "resume", "resolve", "signal", "approval"]


def last_event(store: WorkflowStore, task_id: str) -> tuple[str, dict[str, Any]]:
    event = store.history(task_id)[-1]
    return event.kind, event.detail


@pytest.mark.parametrize("action", ACTIONS)
def test_an_action_without_the_token_is_401_and_changes_nothing(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded, action: str
) -> None:
    before = store.history(seeded.waiting)
    csrf = csrf_of(client)  # a session with a CSRF token, but never logged in
    response = client.post(f"/tasks/{seeded.waiting}/{action}", data={"csrf_token": csrf, "reason": "r"})
    assert response.status_code == 401
    assert "log in with the dashboard's token" in said(response)
    wrong = client.post(
        f"/tasks/{seeded.waiting}/{action}",
        data={"csrf_token": csrf, "reason": "r"},
        headers={"Authorization": "Bearer not-the-token"},
    )
    assert wrong.status_code == 401
    assert store.history(seeded.waiting) == before


@pytest.mark.parametrize("csrf", [None, "", "forged"])
def test_an_action_without_the_sessions_csrf_token_is_403(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded, csrf: str | None
) -> None:
    log_in(client)
    data = {"reason": "r"} if csrf is None else {"reason": "r", "csrf_token": csrf}
    response = client.post(f"/tasks/{seeded.waiting}/cancel", data=data)
    assert response.status_code == 403
    assert "CSRF token is missing or wrong" in said(response)
    assert store.get_task(seeded.waiting).state is TaskState.WAITING


def test_a_csrf_token_of_another_session_is_403(
    app: flask.Flask, store: WorkflowStore, seeded: Seeded
) -> None:
    other = app.test_client()
    theirs = log_in(other)
    mine = app.test_client()
    log_in(mine)
    response = mine.post(f"/tasks/{seeded.waiting}/cancel", data={"reason": "r", "csrf_token": theirs})
    assert response.status_code == 403


def test_cancel_with_the_token_and_csrf_records_the_actor_and_reason(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    csrf = log_in(client, actor="alice")
    response = client.post(
        f"/tasks/{seeded.waiting}/cancel", data={"csrf_token": csrf, "reason": "customer called"}
    )
    assert response.status_code == 303
    assert response.headers["Location"].endswith(f"/tasks/{seeded.waiting}")
    assert store.get_task(seeded.waiting).state is TaskState.CANCELLED
    assert last_event(store, seeded.waiting) == ("cancelled", {"actor": "alice", "reason": "customer called"})
    page = said(client.get(f"/tasks/{seeded.waiting}"))
    assert "cancel: task is cancelled" in page and "customer called" in page


def test_a_bearer_client_acts_without_a_csrf_token_or_a_session(
    app: flask.Flask, store: WorkflowStore, seeded: Seeded
) -> None:
    curl = app.test_client(use_cookies=False)  # as curl: no cookie, no page read first
    response = curl.post(
        f"/tasks/{seeded.waiting}/pause",
        data={"reason": "deploy", "actor": "ci-bot"},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert response.status_code == 303, said(response)
    assert last_event(store, seeded.waiting) == ("paused", {"actor": "ci-bot", "reason": "deploy"})


def test_a_logged_in_browser_session_without_a_bearer_header_still_needs_the_csrf_token(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    log_in(client)
    forged = client.post(f"/tasks/{seeded.waiting}/pause", data={"reason": "r"})
    assert forged.status_code == 403 and "CSRF token is missing or wrong" in said(forged)
    basic = client.post(  # another scheme (a proxy's Basic auth) is no bearer token
        f"/tasks/{seeded.waiting}/pause", data={"reason": "r"}, headers={"Authorization": f"Basic {TOKEN}"}
    )
    assert basic.status_code == 403
    assert not store.get_task(seeded.waiting).paused


def test_pause_resume_retry_resolve_signal_and_approval_record_who_and_why(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    csrf = log_in(client, actor="bob")

    def act(task_id: str, action: str, **fields: str) -> None:
        response = client.post(f"/tasks/{task_id}/{action}", data={"csrf_token": csrf, **fields})
        assert response.status_code == 303, said(response)

    act(seeded.waiting, "pause", reason="hold on")
    assert store.get_task(seeded.waiting).paused
    act(seeded.waiting, "resume", reason="go on")
    assert last_event(store, seeded.waiting) == ("resumed", {"actor": "bob", "reason": "go on"})
    act(seeded.failed, "retry", reason="stock arrived")
    assert store.get_task(seeded.failed).state is TaskState.QUEUED
    assert last_event(store, seeded.failed) == ("requeued", {"actor": "bob", "reason": "stock arrived"})
    act(seeded.ambiguous, "resolve", applied="yes", result='{"charged": 5}', reason="seen in the PSP")
    assert last_event(store, seeded.ambiguous) == (
        "effect_resolved",
        {"effect_key": "charge-1", "applied": True, "actor": "bob", "reason": "seen in the PSP"},
    )
    act(
        seeded.waiting, "signal", name="go", payload='{"ok": 1}', signal_id="form-1", reason="approved by ops"
    )
    kind, detail = last_event(store, seeded.waiting)
    assert (kind, detail["sender"], detail["reason"], detail["signal_id"]) == (
        "signal_received",
        "bob",
        "approved by ops",
        "form-1",
    )
    act("child-1", "approval", name="go", decision="approve", signal_id="form-2", reason="fine")
    (pending,) = store.pending_signals("child-1")
    assert pending.payload == {"approved": True, "reason": "fine"} and pending.sender == "bob"


def test_an_action_the_store_refuses_is_a_409_saying_why(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    csrf = log_in(client)
    response = client.post(f"/tasks/{seeded.completed}/cancel", data={"csrf_token": csrf, "reason": "late"})
    assert response.status_code == 409
    assert seeded.completed in said(response)


def test_an_unknown_action_or_a_missing_reason_is_a_400(client: FlaskClient, seeded: Seeded) -> None:
    csrf = log_in(client)
    unknown = client.post(f"/tasks/{seeded.waiting}/explode", data={"csrf_token": csrf, "reason": "r"})
    assert unknown.status_code == 400 and "action must be one of" in said(unknown)
    bare = client.post(f"/tasks/{seeded.waiting}/cancel", data={"csrf_token": csrf})
    assert bare.status_code == 400 and "form field 'reason' is required" in said(bare)


def test_login_needs_the_token_and_csrf(client: FlaskClient) -> None:
    csrf = csrf_of(client)
    assert client.post("/login", data={"token": TOKEN}).status_code == 403
    wrong = client.post("/login", data={"token": "nope", "csrf_token": csrf})
    assert wrong.status_code == 401 and "not the dashboard's token" in said(wrong)
    assert client.post("/login", data={"token": TOKEN, "csrf_token": csrf, "actor": "a"}).status_code == 303
    assert "acting as a" in said(client.get("/"))
    # Login starts a new session: the CSRF token of the one before no longer works.
    assert client.post("/tasks/order-1/pause", data={"csrf_token": csrf, "reason": "r"}).status_code == 403


def test_logout_ends_the_session(client: FlaskClient, seeded: Seeded) -> None:
    csrf = log_in(client)
    assert client.post("/logout", data={"csrf_token": csrf}).status_code == 303
    assert (
        client.post(f"/tasks/{seeded.waiting}/pause", data={"csrf_token": csrf, "reason": "r"}).status_code
        == 401
    )


def test_a_cookie_kept_from_before_logout_no_longer_acts_in_any_process(
    store: WorkflowStore, seeded: Seeded
) -> None:
    key = b"shared-by-every-process-01"
    here, elsewhere = (create_app(store, token=TOKEN, secret_key=key) for _ in range(2))
    client = here.test_client()
    csrf = log_in(client)
    kept = client.get_cookie("runifold_dashboard")
    assert kept is not None
    other = elsewhere.test_client()  # the same browser's requests served by another process
    other.set_cookie("runifold_dashboard", kept.value)
    assert (
        other.post(f"/tasks/{seeded.waiting}/pause", data={"csrf_token": csrf, "reason": "r"}).status_code
        == 303
    )
    before = store.history(seeded.waiting)

    assert client.post("/logout", data={"csrf_token": csrf}).status_code == 303
    for replayed in (client, other):
        replayed.set_cookie("runifold_dashboard", kept.value)
        response = replayed.post(f"/tasks/{seeded.waiting}/resume", data={"csrf_token": csrf, "reason": "r"})
        assert response.status_code == 401
        assert "login has ended (logged out or expired): log in again" in said(response)
        assert "Log in to act" in said(replayed.get("/"))
    assert store.history(seeded.waiting) == before


def test_a_login_ends_after_the_session_lifetime_of_store_time(
    app: flask.Flask, store: WorkflowStore, seeded: Seeded
) -> None:
    """Four hours by default (not Flask's 31 days), or what create_app is given."""
    client = app.test_client()
    csrf = log_in(client)
    store.set_clock_offset(timedelta(hours=3, minutes=59))
    assert (
        client.post(f"/tasks/{seeded.waiting}/pause", data={"csrf_token": csrf, "reason": "r"}).status_code
        == 303
    )
    store.set_clock_offset(timedelta(hours=4, seconds=1))
    assert (
        client.post(f"/tasks/{seeded.waiting}/resume", data={"csrf_token": csrf, "reason": "r"}).status_code
        == 401
    )

    short = create_app(store, token=TOKEN, session_lifetime=timedelta(minutes=5)).test_client()
    csrf = log_in(short)
    store.set_clock_offset(timedelta(hours=4, minutes=5, seconds=2))
    assert (
        short.post(f"/tasks/{seeded.waiting}/resume", data={"csrf_token": csrf, "reason": "r"}).status_code
        == 401
    )
    assert store.get_task(seeded.waiting).paused


@pytest.mark.parametrize("lifetime", [timedelta(0), timedelta(minutes=-5), 3600, timedelta(days=4000)])
def test_create_app_refuses_a_session_lifetime_that_is_no_positive_duration(
    store: WorkflowStore, lifetime: object
) -> None:
    from runifold_sync.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="dashboard session_lifetime must be"):
        create_app(store, token=TOKEN, session_lifetime=lifetime)  # type: ignore[arg-type]


def test_the_token_is_never_rendered(client: FlaskClient, seeded: Seeded) -> None:
    log_in(client)
    for path in ["/", "/tasks", f"/tasks/{seeded.waiting}", "/login"]:
        assert TOKEN not in said(client.get(path))
    cookie = client.get_cookie("runifold_dashboard")
    assert cookie is not None and TOKEN not in cookie.value


@pytest.mark.parametrize("action", ACTIONS)
def test_a_read_only_dashboard_refuses_every_post_and_says_so(
    store: WorkflowStore, seeded: Seeded, action: str
) -> None:
    client = create_app(store).test_client()
    page = said(client.get(f"/tasks/{seeded.waiting}"))
    assert "read-only: started without a token" in page
    assert 'id="actions"' not in page
    assert 'name="csrf_token"' not in page  # a read-only page has no form to post
    with client.session_transaction() as session:
        session["csrf"] = csrf = "a-valid-csrf-token"  # refused even with a valid one
    response = client.post(
        f"/tasks/{seeded.waiting}/{action}",
        data={"csrf_token": csrf, "reason": "r"},
        headers={"Authorization": "Bearer anything"},
    )
    assert response.status_code == 403
    assert "read-only" in said(response)
    assert client.post("/login", data={"token": "x", "csrf_token": csrf}).status_code == 403
    assert store.get_task(seeded.waiting).state is TaskState.WAITING


def test_create_app_refuses_a_bad_token_without_repeating_it(store: WorkflowStore) -> None:
    from runifold_sync.errors import InvalidArgument

    with pytest.raises(InvalidArgument, match="dashboard token must be a non-empty string") as raised:
        create_app(store, token="   ")
    assert "   " not in str(raised.value).split("got")[-1].strip("a str")
    with pytest.raises(InvalidArgument, match="store must be a WorkflowStore"):
        create_app("sqlite:///x.db")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("action", "field", "text", "why"),
    [
        ("signal", "payload", "NaN", "NaN is not a JSON value"),
        ("signal", "payload", '{"amount": -Infinity}', "-Infinity is not a JSON value"),
        ("signal", "payload", "[" * 10_000 + "]" * 10_000, "nests deeper than 100 levels"),
        ("signal", "payload", "[" * 101 + "]" * 101, "nests deeper than 100 levels"),
        ("signal", "payload", '{"open": ', "must be JSON"),
        ("resolve", "result", "[" * 10_000 + "]" * 10_000, "nests deeper than 100 levels"),
        ("resolve", "result", "Infinity", "Infinity is not a JSON value"),
    ],
)
def test_a_json_field_that_is_not_strict_json_is_a_400_naming_the_field(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded, action: str, field: str, text: str, why: str
) -> None:
    task_id = seeded.waiting if action == "signal" else seeded.ambiguous
    before = store.history(task_id)
    csrf = log_in(client)
    fields = {"name": "go", "signal_id": "form-1", "applied": "yes", field: text}
    response = client.post(f"/tasks/{task_id}/{action}", data={"csrf_token": csrf, "reason": "r", **fields})
    assert response.status_code == 400
    assert f"form field {field!r}" in said(response) and why in said(response)
    assert store.history(task_id) == before


# Task ids that are no plain path segment: dot segments a browser resolves away, slashes,
# and what a URL gives a meaning to (%, ?, #), each as a whole id or part of one.
AWKWARD_IDS = [
    "../../workers",
    "..",
    ".",
    "a/..",
    "../",
    "/lead",
    "a//b",
    "x/cancel",
    "50%",
    "q?x=1#frag",
    "..~",
    ".~~",
    "~",
    "%2e%2e",
    "ünï/cödé",
]


def resolved(base: str, href: str) -> str:
    """The path a browser asks for when it follows ``href`` on the page at ``base``: dot
    segments resolved (RFC 3986, as ``urljoin`` does), percent escapes kept."""
    return urlsplit(urljoin(f"http://localhost{base}", unescape(href))).path


def test_a_task_whose_id_is_no_plain_path_segment_opens_and_is_acted_on_from_its_links(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    store.enqueue_many(
        [WorkflowTask.new("orders", 1, n, checkpoint_id=i, tenant="odd") for n, i in enumerate(AWKWARD_IDS)]
    )
    csrf = log_in(client)
    listing = "/tasks?tenant=odd&limit=100"
    links = re.findall(
        r'class="task-link" href="([^"]*)">([^<]*)</a>', client.get(listing).get_data(as_text=True)
    )
    assert sorted(unescape(t) for _, t in links) == sorted(AWKWARD_IDS)
    for href, shown in links:
        task_id = unescape(shown)
        page_path = resolved(listing, href)
        page = client.get(page_path)
        assert page.status_code == 200, (task_id, page_path)
        opened = re.search(r'<span id="task-id">([^<]*)</span>', page.get_data(as_text=True))
        assert opened is not None and unescape(opened.group(1)) == task_id, (task_id, page_path)
        form = re.search(
            r'<form method="post" action="([^"]*)" class="action" id="action-pause">',
            page.get_data(as_text=True),
        )
        assert form is not None, task_id
        paused = client.post(
            resolved(page_path, form.group(1)), data={"csrf_token": csrf, "reason": "odd id"}
        )
        assert paused.status_code == 303, (task_id, said(paused))
        assert resolved(page_path, paused.headers["Location"]) == page_path
        assert store.get_task(task_id).paused, task_id


def test_a_logged_in_session_gets_the_store_unavailable_page_when_the_store_is_gone(
    app: flask.Flask, store: WorkflowStore
) -> None:
    """The login is checked in the store, which is gone too: the 503 page is still drawn."""
    client = app.test_client()
    log_in(client)
    store.close()
    response = client.get("/")
    assert response.status_code == 503
    assert "is closed" in said(response) and "Log in to act" in said(response)
