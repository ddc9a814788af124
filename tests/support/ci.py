"""Under ``CI`` a skipped test is a failed one (registered for every test directory by
``tests/conftest.py``). Tests skip where a component they need is missing here (a
server, PgBouncer, a Debian package, root); on a developer's machine that is a hint, but
a CI run that skips is a run that did not test what it claims to, so there every skip,
at collection or in a test, is reported as a failure naming what was missing. An
expected failure (``xfail``) is not a skip.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest


def under_ci() -> bool:
    return bool(os.environ.get("CI"))


def _failed_instead(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not (report.skipped and under_ci()) or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI: {reason} (CI is set, so every test must run)"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _failed_instead(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _failed_instead(outcome.get_result())
