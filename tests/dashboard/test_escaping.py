"""Everything stored is rendered escaped: ``<script>`` and an attribute break-out stored
in every field the pages show (task id, workflow and signal names, tenant, queue, input,
result, failure reason, signal payload and reason, operator actor and reason, published
event, worker host, a schedule's workflow) never come back raw, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from urllib.parse import quote, urlencode

from flask.testing import FlaskClient
from markupsafe import escape

from runifold_sync import Schedule, WorkerId, WorkflowStore, WorkflowTask
from runifold_sync.dashboard import create_app
from runifold_sync.model.flow import FlowLimit
from runifold_sync.store import TenantPolicy
from runifold_sync.testing import run_until_idle

from .flows import XSS, broken_flow, orders_flow, registry

SCRIPT, BREAKOUT = XSS


def stored_everywhere(store: WorkflowStore) -> list[str]:
    """Tasks and rows with the two strings in every shown field; returns the task ids."""
    flows = registry(orders_flow(SCRIPT, BREAKOUT), broken_flow(BREAKOUT))
    done, waits, broken = f"{SCRIPT}-done", f"{BREAKOUT}-waits", f"{SCRIPT}{BREAKOUT}"
    store.set_tenant_policy(TenantPolicy(SCRIPT, max_leased=0))  # holds its ready tasks
    store.enqueue_many(
        [
            WorkflowTask.new(SCRIPT, 1, {SCRIPT: BREAKOUT}, checkpoint_id=done, tenant=BREAKOUT),
            WorkflowTask.new(SCRIPT, 1, BREAKOUT, checkpoint_id=waits, tenant=BREAKOUT),
            WorkflowTask.new(BREAKOUT, 1, SCRIPT, checkpoint_id=broken, tenant=BREAKOUT),
        ]
    )
    run_until_idle(store, flows)
    store.send_signal(done, BREAKOUT, {BREAKOUT: SCRIPT}, signal_id=SCRIPT, sender=BREAKOUT, tenant=BREAKOUT)
    run_until_idle(store, flows)  # completes, its result holding the payload
    store.pause(waits, actor=SCRIPT, reason=BREAKOUT)
    store.send_signal(  # stays pending: the task is paused
        waits, BREAKOUT, [SCRIPT], signal_id=BREAKOUT, sender=SCRIPT, tenant=BREAKOUT, reason=SCRIPT
    )
    held = f"{BREAKOUT}-held"
    store.enqueue(WorkflowTask.new(BREAKOUT, 7, None, checkpoint_id=held, tenant=SCRIPT, queue=BREAKOUT))
    store.register_worker(
        WorkerId.parse("w-1"), host=SCRIPT, pid=1, definitions=[(BREAKOUT, 7, SCRIPT)], queues=[SCRIPT]
    )
    store.declare_schedules([Schedule("nightly", BREAKOUT, 1, every=timedelta(hours=1), input=SCRIPT)])
    store.set_flow_limit(FlowLimit("key", SCRIPT, max_running=0))  # the tenants page's flow tables
    keyed = f"{SCRIPT}-keyed"
    store.enqueue(WorkflowTask.new(BREAKOUT, 7, None, checkpoint_id=keyed, concurrency_key=SCRIPT))
    return [done, waits, broken, held, keyed]


def test_no_stored_string_comes_back_raw_on_any_page(store: WorkflowStore) -> None:
    task_ids = stored_everywhere(store)
    client: FlaskClient = create_app(store, token="t").test_client()
    paths = ["/", "/tasks", "/workers", "/versions", "/tenants", "/schedules", "/login"]
    paths += [f"/tasks/{quote(task_id, safe='')}" for task_id in task_ids]
    paths += [
        "/tasks?" + urlencode({"tenant": BREAKOUT}),
        "/tasks?" + urlencode({"definition": SCRIPT, "queue": BREAKOUT, "parent": SCRIPT}),
        "/tasks?" + urlencode({"id": SCRIPT}),  # no such task: the page says so, escaped
        "/tasks?" + urlencode({"state": SCRIPT}),  # 400, naming the value
        "/tasks?" + urlencode({"after": BREAKOUT}),  # 400, naming the value
        f"/tasks/{quote(SCRIPT, safe='')}",  # 404, naming it
    ]
    shown = ""
    for path in paths:
        response = client.get(path)
        assert response.status_code in (200, 400, 404), (path, response.status_code)
        page = response.get_data(as_text=True)
        for raw in XSS:
            assert raw not in page, (path, raw)
        assert "<script" not in page.lower() and "<img" not in page.lower(), path
        shown += page
    # Each was shown, escaped: the test looked at pages that hold them.
    for raw in XSS:
        assert str(escape(raw)) in shown


def test_a_task_page_shows_every_stored_field_escaped(store: WorkflowStore) -> None:
    done, waits, broken, *_ = stored_everywhere(store)
    client = create_app(store, token="t").test_client()
    page = client.get(f"/tasks/{quote(waits, safe='')}").get_data(as_text=True)
    escaped = str(escape(SCRIPT))
    assert page.count(escaped) >= 3  # the workflow name, the pause's actor, the signal's reason
    assert str(escape(BREAKOUT)) in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    result = client.get(f"/tasks/{quote(done, safe='')}").get_data(as_text=True)
    assert 'id="task-result"' in result
    failed = client.get(f"/tasks/{quote(broken, safe='')}").get_data(as_text=True)
    assert "ValueError" in failed
