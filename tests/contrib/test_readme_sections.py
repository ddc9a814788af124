"""The README's "Embedding in Django" and "Embedding in Flask" sections, followed as a
newcomer would: a fresh ``django-admin startproject`` (or an empty directory) gets each
file the sections show (a ```` ```python ```` block whose first line is ``# path``), and the
test each section ends with runs there, in a process of its own, and passes. The file of
"Results and events" runs as it is and prints what its comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runifold_sync.store.open import ENV_VAR

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.timeout(120)


def _section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    return text[start : text.index("\n## ", start + 1)]


def _files(section: str) -> dict[str, str]:
    """Each ``# path`` python block of ``section``, by path."""
    files = {}
    for block in re.findall(r"```python\n(.*?)```", section, re.S):
        first, _, body = block.partition("\n")
        assert first.startswith("# "), f"a python block of the README names no file: {first!r}"
        files[first[2:]] = body
    return files


def _run(cwd: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in (ENV_VAR, "DJANGO_SETTINGS_MODULE")}
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=100
    )
    assert done.returncode == 0, f"{' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def test_the_django_section_builds_a_project_whose_test_passes(tmp_path: Path) -> None:
    files = _files(_section("Embedding in Django"))
    assert set(files) == {
        "mysite/settings.py",
        "shop/workflows.py",
        "shop/models.py",
        "shop/views.py",
        "mysite/urls.py",
        "shop/tests.py",
    }
    _run(tmp_path, "-m", "django", "startproject", "mysite", ".")
    _run(tmp_path, "manage.py", "startapp", "shop")
    settings = tmp_path / "mysite" / "settings.py"
    generated = settings.read_text()
    defaults = re.search(r"INSTALLED_APPS = \[\n(.*?)\]\n", generated, re.S)
    assert defaults is not None
    added = files.pop("mysite/settings.py").replace("    # ... Django's and yours ...\n", defaults[1])
    settings.write_text(generated.replace(defaults[0], "") + added)
    for path, body in files.items():
        (tmp_path / path).write_text(body)
    _run(tmp_path, "manage.py", "makemigrations", "shop")
    _run(tmp_path, "manage.py", "migrate")
    out = _run(tmp_path, "manage.py", "test")
    assert "Ran 1 test" in out and "OK" in out


def test_the_flask_section_builds_an_app_whose_test_passes(tmp_path: Path) -> None:
    files = _files(_section("Embedding in Flask"))
    assert set(files) == {
        "myapp/__init__.py",
        "myapp/workflows.py",
        "tests/test_orders.py",
        "tests/test_order_workflow.py",
    }
    for path, body in files.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(body)
    out = _run(tmp_path, "-m", "pytest", "-p", "no:cacheprovider", "-q", "tests")
    assert "2 passed" in out  # each test file the section shows


def test_the_results_section_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    files = _files(_section("Results and events"))
    assert set(files) == {"order_status.py"}
    body = files["order_status.py"]
    (tmp_path / "order_status.py").write_text(body)
    said = [line.split("# ")[-1] for line in body.splitlines() if line.strip().startswith("print(")]
    for _ in range(2):  # run again, on the store the first run left: the same answers
        assert _run(tmp_path, "order_status.py").splitlines() == said
