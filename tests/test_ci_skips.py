"""Under ``CI`` the suite's plugin (``tests/support/ci.py``, registered for every test
directory) reports every skip as a failure: in a test, in a fixture, and of a whole
module at collection. Without ``CI`` a skip stays a skip, and an ``xfail`` is never a
skip. Run in a pytest of its own, on a small test file, with and without ``CI``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = """
import pytest

@pytest.fixture
def server():
    pytest.skip("the widget server is not running")

def test_in_the_body():
    pytest.skip("no widget binary")

def test_in_a_fixture(server):
    pass

@pytest.mark.xfail(reason="known")
def test_expected_to_fail():
    assert False

def test_passes():
    pass
"""
MODULE_SKIP = """
import pytest
pytest.skip("module needs the widget library", allow_module_level=True)
"""


def _pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_widgets.py").write_text(TESTS)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(ROOT)}
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.ci", "-p", "no:cacheprovider", "-q"]
        + ["--continue-on-collection-errors"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(150)
def test_under_ci_every_skip_fails_naming_what_was_missing(tmp_path: Path) -> None:
    done = _pytest(tmp_path, "true")
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 xfailed, 2 errors" in summary, done.stdout
    assert "skipped under CI: Skipped: no widget binary (CI is set, so every test must run)" in done.stdout
    assert "skipped under CI: Skipped: the widget server is not running" in done.stdout
    assert "skipped under CI: Skipped: module needs the widget library" in done.stdout


@pytest.mark.timeout(150)
def test_outside_ci_a_skip_stays_a_skip(tmp_path: Path) -> None:
    done = _pytest(tmp_path, None)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout
    assert "1 passed, 3 skipped, 1 xfailed" in summary, done.stdout
