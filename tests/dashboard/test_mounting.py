"""The README's "Dashboard" section followed as written: its Flask file mounts the
dashboard under ``/ops`` with ``DispatcherMiddleware``, its Django URLconf includes it
under ``ops/``; in each, the pages answer under the prefix with links that stay under
it, and a login and a cancel work (Django's CSRF middleware enforced)."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask, open_store
from runifold_sync.store import TaskState

README = Path(__file__).resolve().parents[2] / "README.md"
TOKEN = "mount-token-5e2a"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


def _files() -> dict[str, str]:
    text = README.read_text()
    start = text.index("\n## Dashboard\n")
    section = text[start : text.index("\n## ", start + 1)]
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        first, _, body = block.partition("\n")
        files[first.removeprefix("# ")] = body
    return files


def test_the_readme_shows_a_flask_and_a_django_mount() -> None:
    assert set(_files()) == {"ops_app.py", "mysite/urls.py"}


def test_the_flask_mount_serves_the_dashboard_under_its_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    with open_store(url) as store:
        store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    (tmp_path / "ops_app.py").write_text(_files()["ops_app.py"])
    monkeypatch.setenv("RUNIFOLD_DATABASE_URL", url)
    monkeypatch.setenv("RUNIFOLD_DASHBOARD_TOKEN", TOKEN)
    module = runpy.run_path(str(tmp_path / "ops_app.py"))
    try:
        client = module["app"].test_client()
        assert client.get("/").get_data(as_text=True) == "the application's own pages"
        overview = client.get("/ops/").get_data(as_text=True)
        assert 'href="/ops/tasks"' in overview and 'href="/ops/static/dashboard.css"' in overview
        assert client.get("/ops/static/dashboard.css").status_code == 200
        assert 'href="/ops/tasks/t1"' in client.get("/ops/tasks").get_data(as_text=True)
        login = CSRF.search(client.get("/ops/login").get_data(as_text=True))
        assert login is not None
        done = client.post("/ops/login", data={"csrf_token": login[1], "token": TOKEN, "actor": "ann"})
        assert done.status_code == 303 and done.headers["Location"].endswith("/ops/")
        csrf = CSRF.search(client.get("/ops/tasks/t1").get_data(as_text=True))
        assert csrf is not None
        cancel = client.post("/ops/tasks/t1/cancel", data={"csrf_token": csrf[1], "reason": "dup"})
        assert cancel.status_code == 303 and cancel.headers["Location"].endswith("/ops/tasks/t1")
        assert module["store"].history("t1")[-1].detail == {"actor": "ann", "reason": "dup"}
    finally:
        module["store"].close()


DJANGO_SETTINGS = """
SECRET_KEY = "test-only-secret-key-for-the-dashboard-mount"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "mysite.urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "runifold_sync.contrib.django"]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
DATABASES = {}
USE_TZ = True
"""

DJANGO_CLIENT = """
import re

import django
django.setup()
from django.test import Client

from runifold_sync.contrib.django import get_store

csrf = re.compile(r'name="csrf_token" value="([^"]+)"')
client = Client(enforce_csrf_checks=True)
overview = client.get("/ops/")
assert overview.status_code == 200, overview.content
page = overview.content.decode()
assert 'href="/ops/tasks"' in page and 'href="/ops/static/dashboard.css"' in page, page
assert overview["Content-Security-Policy"].startswith("default-src 'self'")
assert client.get("/ops/static/dashboard.css").status_code == 200
assert 'href="/ops/tasks/t1"' in client.get("/ops/tasks").content.decode()
token = csrf.search(client.get("/ops/login").content.decode())[1]
done = client.post("/ops/login", {"csrf_token": token, "token": "%(token)s", "actor": "dj"})
assert done.status_code == 303 and done["Location"].endswith("/ops/"), done.content
token = csrf.search(client.get("/ops/tasks/t1").content.decode())[1]
cancel = client.post("/ops/tasks/t1/cancel", {"csrf_token": token, "reason": "from django"})
assert cancel.status_code == 303, cancel.content
assert client.post("/ops/tasks/t1/pause", {"reason": "no csrf"}).status_code == 403
assert get_store().history("t1")[-1].detail == {"actor": "dj", "reason": "from django"}
print("ok")
"""


@pytest.mark.timeout(60)
def test_the_django_include_serves_the_dashboard_under_its_prefix(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    with open_store(url) as store:
        store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="t1"))
    (tmp_path / "mysite").mkdir()
    (tmp_path / "mysite" / "__init__.py").write_text("")
    (tmp_path / "mysite" / "urls.py").write_text(_files()["mysite/urls.py"])
    (tmp_path / "mysite" / "settings.py").write_text(DJANGO_SETTINGS)
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "mysite.settings",
        "RUNIFOLD_DATABASE_URL": url,
        "RUNIFOLD_DASHBOARD_TOKEN": TOKEN,
        "PYTHONPATH": str(tmp_path),
    }
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DJANGO_CLIENT % {"token": TOKEN})],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open_store(url) as store:
        assert store.get_task("t1").state is TaskState.CANCELLED


EXAMPLE_CLIENT = """
import django
django.setup()
from django.test import Client

page = Client().get("/ops/tasks")
assert page.status_code == 200, page.content
assert 'href="/ops/tasks/example-1"' in page.content.decode()
assert "read-only: started without a token" in page.content.decode()
print("ok")
"""


@pytest.mark.timeout(60)
def test_the_example_django_project_serves_the_dashboard_under_ops(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'workflows.db'}"
    with open_store(url) as store:
        store.enqueue(WorkflowTask.new("orders", 1, None, checkpoint_id="example-1"))
    example = README.parent / "examples" / "django_project"
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "RUNIFOLD_DATABASE_URL": url,
        "PYTHONPATH": str(example),
    }
    done = subprocess.run(
        [sys.executable, "-c", EXAMPLE_CLIENT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
    )
    assert done.returncode == 0, done.stdout + done.stderr
