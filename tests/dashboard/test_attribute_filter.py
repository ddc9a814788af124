"""The task list's attribute filter (``where=key=value``, repeatable): the tasks whose
search attributes (``ctx.set_attributes``) hold every condition, kept across pages, a
malformed condition a 400 naming it, and what the filter echoes escaped."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

from runifold_sync import WorkflowStore
from runifold_sync.dashboard import create_app
from runifold_sync.outcomes import Suspended
from tests.engine.test_attributes import enqueue, run_once


def listed(page: str) -> list[str]:
    return [unescape(t) for t in re.findall(r'class="task-link" href="[^"]*">([^<]*)</a>', page)]


def test_the_task_list_filters_by_attributes(store: WorkflowStore) -> None:
    enqueue(store, "o1", "c-42", 120)
    enqueue(store, "o2", "c-42", 80, vip=True)
    enqueue(store, "o3", "<b>c-7</b>", 120)
    for _ in range(3):
        assert isinstance(run_once(store), Suspended)
    client = create_app(store, token="t0k3n-attr").test_client()

    def get(query: str, status: int = 200) -> str:
        response = client.get(f"/tasks?{query}")
        assert response.status_code == status, response.get_data(as_text=True)[:2000]
        return response.get_data(as_text=True)

    assert listed(get("where=customer%3Dc-42")) == ["o1", "o2"]
    assert listed(get("where=customer%3Dc-42&where=amount%3D120")) == ["o1"]
    assert listed(get("where=vip%3Dtrue")) == ["o2"]
    assert listed(get("where=amount%3D120&state=waiting")) == ["o1", "o3"]
    # Kept on the next page's link.
    first = get("where=amount%3D120&limit=1")
    assert listed(first) == ["o1"]
    link = re.search(r'href="([^"]*)" id="next-page"', first)
    assert link is not None and "where=amount%3D120" in link[1]
    assert listed(get(unescape(link[1]).split("?", 1)[1])) == ["o3"]
    # Text that is markup is matched as text and shown escaped, in the list and the form.
    page = get("where=customer%3D%3Cb%3Ec-7%3C/b%3E")
    assert listed(page) == ["o3"]
    assert "<b>c-7</b>" not in page and "customer=&lt;b&gt;c-7&lt;/b&gt;" in page
    # Malformed conditions: a 400 naming them, escaped.
    assert "where must be key=value, got &#39;&lt;x&gt;&#39;" in get("where=%3Cx%3E", 400)
    assert "attribute &#39;a&#39; is given twice" in get("where=a%3D1&where=a%3D2", 400)
    assert "where key must be non-empty" in get("where=%3D1", 400)
    # The task page lists them, each a link to the tasks that have it too.
    task_page = get_page(client, "/tasks/o1")
    assert 'id="attributes"' in task_page and "c-42" in task_page
    link = re.search(r'href="([^"]*)">&#34;c-42&#34;</a>', task_page)
    assert link is not None, task_page[task_page.index('id="attributes"') :][:800]
    assert listed(get_page(client, unescape(link[1]))) == ["o1", "o2"]
    assert "&lt;b&gt;c-7&lt;/b&gt;" in get_page(client, "/tasks/o3")


def get_page(client: Any, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, response.get_data(as_text=True)[:2000]
    return str(response.get_data(as_text=True))
