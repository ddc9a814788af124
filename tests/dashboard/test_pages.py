"""Every page of the dashboard over a seeded store, on SQLite and PostgreSQL: what each
shows, the task list's filters, id search and keyset pages, and the headers on every
response."""

from __future__ import annotations

import re
from datetime import timedelta
from html import unescape

import pytest
from flask.testing import FlaskClient

from runifold_sync import Schedule, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.dashboard import create_app
from runifold_sync.errors import SignalRefused

from .flows import Seeded, broken_flow, registry

PAGES = ["/", "/tasks", "/workers", "/versions", "/tenants", "/schedules", "/login"]


def text(client: FlaskClient, path: str, status: int = 200) -> str:
    response = client.get(path)
    assert response.status_code == status, (path, response.get_data(as_text=True)[:2000])
    return unescape(response.get_data(as_text=True))


def listed(page: str) -> list[str]:
    """The task ids a task list shows, in order."""
    return [unescape(t) for t in re.findall(r'class="task-link" href="[^"]*">([^<]*)</a>', page)]


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders(client: FlaskClient, path: str) -> None:
    assert "runifold_sync" in text(client, path)


def test_the_overview_counts_tasks_per_tenant_and_shows_holds_and_unserved_work(
    client: FlaskClient, seeded: Seeded
) -> None:
    page = text(client, "/")
    counts = re.search(r'<table id="counts">.*?</table>', page, re.S)
    assert counts is not None
    rows = {
        cells[0]: cells[1:]
        for cells in (
            re.findall(r"<td[^>]*>(?:<a [^>]*>)?([^<]*)", row)
            for row in re.findall(r"<tr>(.*?)</tr>", counts[0], re.S)
        )
        if cells
    }
    # queued, leased, waiting, completed, failed, cancelled
    assert rows["acme"] == ["0", "0", "1", "1", "0", "0"]  # order-1 waits; order-2 completed
    assert rows["default"] == ["0", "0", "2", "0", "2", "0"]  # parent and child wait; two failed
    assert rows["globex"] == ["1", "0", "0", "0", "0", "0"]
    assert 'id="throughput"' in page and page.count('class="bar"') == 12
    assert "3 tasks finished" in page  # order-2 completed; broken-1 and ambiguous-1 failed
    assert "No worker is live" in page  # run_until_idle's worker stopped


def test_the_task_list_filters_by_state_tenant_definition_queue_and_parent(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    everything = listed(text(client, "/tasks"))
    assert everything == [t.task_id for t in store.list_tasks()]  # creation order
    assert sorted(everything) == sorted(
        ["broken-1", "order-1", "order-2", "parent-1", "child-1", "ambiguous-1", "queued-1"]
    )
    assert sorted(listed(text(client, "/tasks?state=waiting"))) == ["child-1", "order-1", "parent-1"]
    assert listed(text(client, "/tasks?tenant=globex")) == ["queued-1"]
    assert listed(text(client, "/tasks?definition=orders&state=terminal")) == ["order-2"]
    assert listed(text(client, "/tasks?queue=render")) == ["queued-1"]
    assert listed(text(client, "/tasks?parent=parent-1")) == ["child-1"]
    assert "No task matches." in text(client, "/tasks?tenant=nobody")


def test_a_bad_filter_is_a_400_naming_it(client: FlaskClient) -> None:
    assert "state must be one of queued, leased, waiting, terminal, cancelled, got 'bogus'" in text(
        client, "/tasks?state=bogus", 400
    )
    assert "limit must be an integer in 1..10000, got '0'" in text(client, "/tasks?limit=0", 400)
    assert "task page cursor must be a cursor a page returned" in text(client, "/tasks?after=nonsense", 400)


def test_searching_an_id_opens_the_task_or_says_there_is_none(client: FlaskClient, seeded: Seeded) -> None:
    found = client.get("/tasks?id=order-1")
    assert found.status_code == 303 and found.headers["Location"].endswith("/tasks/order-1")
    assert "No task has the id nope." in text(client, "/tasks?id=nope")


def test_the_task_list_pages_by_keyset_through_every_task(client: FlaskClient, store: WorkflowStore) -> None:
    store.enqueue_many([WorkflowTask.new("bulk", 1, n, checkpoint_id=f"bulk-{n:03}") for n in range(23)])
    seen: list[str] = []
    path: str | None = "/tasks?definition=bulk&limit=10"
    pages = 0
    while path is not None:
        page = text(client, path)
        seen += listed(page)
        pages += 1
        found = re.search(r'href="([^"]*)" id="next-page"', page)
        path = None if found is None else unescape(found.group(1))
        if pages > 1:
            assert 'id="first-page"' in page
    assert seen == [f"bulk-{n:03}" for n in range(23)]
    assert pages == 3


def test_the_task_page_shows_state_input_journal_timeline_signals_events_and_history(
    client: FlaskClient, seeded: Seeded
) -> None:
    page = text(client, f"/tasks/{seeded.waiting}")
    assert "waiting for signal 'go'" in page
    assert '"A-1"' in page  # the input
    assert "pack#1 (step, done)" in page or "pack" in page
    assert 'id="timeline"' in page and 'class="period running"' in page and 'class="period waiting"' in page
    assert "stage" in page and '"packing"' in page  # the published event
    for kind in ("enqueued", "claimed", "suspended"):
        assert f'class="event-{kind}"' in page
    completed = text(client, f"/tasks/{seeded.completed}")
    assert 'id="task-result"' in completed and '"label": "packed A-2"' in completed
    assert "signal_received" in completed  # its signal, sent by ops
    parent = text(client, f"/tasks/{seeded.parent}")
    assert 'href="/tasks/child-1"' in parent
    child = text(client, "/tasks/child-1")
    assert 'href="/tasks/parent-1"' in child
    failed = text(client, f"/tasks/{seeded.failed}")
    assert "ValueError in step explode" in failed


def test_an_unknown_task_is_a_404(client: FlaskClient) -> None:
    assert "task 'nope'" in text(client, "/tasks/nope", 404) or "nope" in text(client, "/tasks/nope", 404)


def test_workers_versions_and_tenants_pages_show_the_registry_and_policies(
    client: FlaskClient, seeded: Seeded
) -> None:
    workers = text(client, "/workers")
    assert "stopped" in workers  # run_until_idle's worker registered and stopped
    versions = text(client, "/versions")
    assert "render</a> v2" in versions and "orders</a> v1" in versions
    tenants = text(client, "/tenants")
    assert "acme</a>" in tenants and "<td>4</td>" in tenants
    assert "No flow limit" in tenants


EXPECTED_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}


@pytest.mark.parametrize(
    "path", [*PAGES, "/tasks/order-1", "/tasks/nope", "/static/dashboard.css", "/tasks?state=bogus"]
)
def test_every_response_carries_the_security_headers(client: FlaskClient, seeded: Seeded, path: str) -> None:
    response = client.get(path)
    for name, value in EXPECTED_HEADERS.items():
        assert response.headers.get(name) == value, (path, name)


def test_a_post_response_carries_the_security_headers_too(client: FlaskClient, seeded: Seeded) -> None:
    response = client.post("/tasks/order-1/cancel", data={"reason": "x"})
    assert response.status_code == 401
    for name, value in EXPECTED_HEADERS.items():
        assert response.headers.get(name) == value


def test_the_pages_have_no_script_and_no_outside_asset(client: FlaskClient, seeded: Seeded) -> None:
    for path in [*PAGES, "/tasks/order-1"]:
        page = client.get(path).get_data(as_text=True)
        assert "<script" not in page.lower()
        assert not re.search(r'(?:src|href)="(?:https?:)?//', page), path
        assert " style=" not in page  # CSP blocks inline styles: everything is in the CSS file


def test_the_overview_names_work_the_live_workers_cannot_claim(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    store.register_worker(
        WorkerId.parse("w-live"),
        host="h",
        pid=1,
        definitions=[("orders", 1), ("parent", 1)],
        queues=["default"],
    )
    page = text(client, "/")
    assert "1 tasks of render v2 in queue render: no live worker serves queue 'render'" in page
    assert "payments v1: 1 tasks reference it, no live worker serves it" in page
    assert "w-live" in page


def test_a_task_page_sets_usage_against_the_budget_of_the_registry_given(
    store: WorkflowStore, seeded: Seeded
) -> None:
    without = text(create_app(store).test_client(), f"/tasks/{seeded.waiting}")
    assert "start the dashboard with --app" in without
    page = text(create_app(store, registry=registry()).test_client(), f"/tasks/{seeded.waiting}")
    usage = re.search(r'<table id="usage">.*?</table>', page, re.S)
    assert usage is not None
    rows = [
        re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", usage[0], re.S)
    ]
    assert [r for r in rows if r] == [
        ["steps", "1", "40"],
        ["cost", "0.0", "12.5"],
        ["run time (s)", rows[3][1], "-"],
        ["claims without progress", "0", "5"],
    ]
    lacking = text(
        create_app(store, registry=registry(broken_flow())).test_client(), f"/tasks/{seeded.waiting}"
    )
    assert "lacks orders v1: its budget is unknown here" in lacking


def test_a_long_input_is_shown_cut_to_its_start(client: FlaskClient, store: WorkflowStore) -> None:
    store.enqueue(WorkflowTask.new("bulk", 1, {"blob": "x" * 300_000}, checkpoint_id="big"))
    page = text(client, "/tasks/big")
    assert "characters; the first 20,000 shown)" in page
    assert len(page) < 60_000


def test_a_failures_traceback_is_shown_with_its_lines(client: FlaskClient, seeded: Seeded) -> None:
    page = client.get(f"/tasks/{seeded.failed}").get_data(as_text=True)
    trace = re.search(r'<details class="traceback"><summary>traceback</summary><pre>(.*?)</pre>', page, re.S)
    assert trace is not None
    assert "Traceback (most recent call last):\n" in unescape(trace.group(1))
    assert "raise ValueError(message)" in unescape(trace.group(1))


def test_the_task_list_pages_newest_first_when_asked(client: FlaskClient, store: WorkflowStore) -> None:
    store.enqueue_many([WorkflowTask.new("bulk", 1, n, checkpoint_id=f"bulk-{n:03}") for n in range(7)])
    seen: list[str] = []
    path: str | None = "/tasks?definition=bulk&limit=3&order=newest"
    while path is not None:
        page = text(client, path)
        assert '<option value="newest" selected>' in page
        seen += listed(page)
        found = re.search(r'href="([^"]*)" id="next-page"', page)
        path = None if found is None else unescape(found.group(1))
    assert seen == [f"bulk-{n:03}" for n in reversed(range(7))]
    assert "order must be oldest or newest, got 'up'" in text(client, "/tasks?order=up", 400)


def test_the_schedules_show_their_expression_and_last_and_next_tick(
    client: FlaskClient, store: WorkflowStore
) -> None:
    store.declare_schedules([Schedule("hourly", "orders", 1, every=timedelta(hours=1))])
    for path in ("/", "/schedules"):
        page = text(client, path)
        row = re.search(r"<td>hourly</td>(.*?)</tr>", page, re.S)
        assert row is not None, path
        cells = re.findall(r"<td>([^<]*)</td>", row.group(1))
        assert cells[0] == "orders v1" and cells[1] == "every 1h" and cells[2] == "UTC", cells
        assert cells[3] == "-" and cells[4].endswith(":00:00 UTC") and cells[5] == "active", cells


def test_a_task_page_counts_the_signals_refused_past_those_its_history_shows(
    client: FlaskClient, store: WorkflowStore, seeded: Seeded
) -> None:
    for n in range(300):  # a finished task refuses every signal
        with pytest.raises(SignalRefused):
            store.send_signal(seeded.completed, "go", n, signal_id=f"late-{n}", sender="bot", tenant="acme")
    page = text(client, f"/tasks/{seeded.completed}")
    assert "300 signals refused when sent: the history shows the first 20, the rest are counted." in page
    assert page.count('"signal_id": "late-') == 2 * 20  # each recorded one, in signals and history
    assert "late-20" not in page
