"""The dashboard included in a Django URLconf under ``ops/``: the pages answer under the
prefix with links that stay under it, and a login and a cancel work (Django's CSRF
middleware enforced); the example project serves it too. (The Flask mount of
docs/howto/dashboard.md runs with the documentation's examples.)"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runifold_sync import WorkflowTask, open_store
from runifold_sync.store import TaskState

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "mount-token-5e2a"
CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


# A URLconf that includes the dashboard, as docs/howto/dashboard.md shows (the Flask mount
# there runs with the documentation's examples).
DJANGO_URLS = """
import os

from django.urls import include, path

from runifold_sync.contrib.django.dashboard import dashboard_urls

urlpatterns = [
    path("ops/", include(dashboard_urls(token=os.environ.get("RUNIFOLD_DASHBOARD_TOKEN")))),
]
"""


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
    (tmp_path / "mysite" / "urls.py").write_text(DJANGO_URLS)
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
    example = ROOT / "examples" / "django_project"
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
