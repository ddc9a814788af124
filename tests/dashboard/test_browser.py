"""The dashboard in a real browser (the system Chromium, headless, driven by Selenium
through Debian's chromedriver; nothing is downloaded), served by waitress, on SQLite
and PostgreSQL: open the overview, filter the tasks, open one, log in with the token,
cancel it and see the cancel in its history. Screenshots of each stage go under the
test's tmp dir; with ``RUNIFOLD_DASHBOARD_SCREENSHOT=PATH`` set, the task page's is
also kept at PATH (``tools/dashboard_screenshot`` makes ``docs/dashboard.png`` so).

Without Chromium the test is skipped, except under ``CI``, where it fails: ``.ci/run``
installs it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from runifold_sync import WorkflowStore, WorkflowTask
from runifold_sync.dashboard import create_app
from runifold_sync.dashboard.serving import serve_in_background
from runifold_sync.store import TaskState

from .conftest import TOKEN
from .flows import Seeded, registry

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _need_chromium() -> None:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        message = f"{', '.join(missing)} not installed (Debian: apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so the browser tests must run")
        pytest.skip(message)


def follow(browser: webdriver.Chrome, element: WebElement) -> None:
    """Click ``element`` and wait for the page it leads to: a click returns before the
    browser has navigated, and the old page's elements go stale under the test."""
    page = browser.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(browser, 30).until(lambda _: _left(page))


def _left(page: WebElement) -> bool:
    """Whether the browser has left ``page``. Caught mid-navigation, Chromium reports the
    old page's node as no longer in the document (a ``WebDriverException``), which is the
    same news as the stale reference Selenium's ``staleness_of`` alone expects."""
    try:
        page.is_enabled()
    except StaleElementReferenceException:
        return True
    except WebDriverException as exc:
        if "does not belong to the document" in (exc.msg or ""):
            return True
        raise
    return False


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    _need_chromium()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1280,1800"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.mark.timeout(120)
def test_an_operator_finds_a_task_and_cancels_it_in_the_browser(
    browser: webdriver.Chrome, store: WorkflowStore, seeded: Seeded, tmp_path: Path
) -> None:
    served = serve_in_background(create_app(store, token=TOKEN, registry=registry()))
    try:
        browser.get(served.url)
        assert browser.title.startswith("Overview")
        assert browser.find_element(By.ID, "throughput").is_displayed()
        browser.save_screenshot(str(tmp_path / "1-overview.png"))

        follow(browser, browser.find_element(By.LINK_TEXT, "Tasks"))
        Select(browser.find_element(By.ID, "filter-state")).select_by_value("waiting")
        browser.find_element(By.ID, "filter-tenant").send_keys("acme")
        follow(browser, browser.find_element(By.ID, "filter-submit"))
        listed = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#task-list a.task-link")]
        assert listed == [seeded.waiting]
        assert "state=waiting" in browser.current_url and "tenant=acme" in browser.current_url
        browser.save_screenshot(str(tmp_path / "2-filtered.png"))

        follow(browser, browser.find_element(By.LINK_TEXT, seeded.waiting))
        assert browser.find_element(By.ID, "task-id").text == seeded.waiting
        assert "waiting for signal 'go'" in browser.find_element(By.ID, "task-reason").text
        assert browser.find_element(By.ID, "timeline").is_displayed()
        assert not browser.find_elements(By.ID, "action-cancel")  # not logged in: no forms
        browser.save_screenshot(str(tmp_path / "3-task.png"))

        follow(browser, browser.find_element(By.ID, "login-link"))
        browser.find_element(By.ID, "actor").send_keys("alice")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        follow(browser, browser.find_element(By.ID, "login-submit"))
        assert "acting as alice" in browser.find_element(By.TAG_NAME, "header").text

        browser.get(served.url + f"tasks/{seeded.waiting}")
        cancel = browser.find_element(By.ID, "action-cancel")
        cancel.find_element(By.NAME, "reason").send_keys("customer withdrew the order")
        follow(browser, cancel.find_element(By.CSS_SELECTOR, "button.act-cancel"))

        assert "cancel: task is cancelled" in browser.find_element(By.CLASS_NAME, "flash").text
        assert browser.find_element(By.ID, "task-state").text == "cancelled"
        (row,) = browser.find_elements(By.CSS_SELECTOR, "#history tr.event-cancelled")
        assert "alice" in row.text and "customer withdrew the order" in row.text
        browser.save_screenshot(str(tmp_path / "4-cancelled.png"))
        assert store.get_task(seeded.waiting).state is TaskState.CANCELLED
        kept = os.environ.get("RUNIFOLD_DASHBOARD_SCREENSHOT")
        if kept:
            browser.get(served.url + f"tasks/{seeded.completed}")
            browser.save_screenshot(kept)
    finally:
        served.stop()
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "1-overview.png",
        "2-filtered.png",
        "3-task.png",
        "4-cancelled.png",
    ]


@pytest.mark.timeout(120)
def test_a_task_whose_id_holds_dot_segments_opens_and_is_paused_in_the_browser(
    browser: webdriver.Chrome, store: WorkflowStore, seeded: Seeded
) -> None:
    """Chromium resolves ``..`` in a link (``%2e%2e`` too) before it asks: each id's link
    and form must still lead to that task."""
    odd = ["../../workers", "..", "a/../b"]
    store.enqueue_many(
        [WorkflowTask.new("orders", 1, n, checkpoint_id=i, tenant="odd") for n, i in enumerate(odd)]
    )
    served = serve_in_background(create_app(store, token=TOKEN))
    try:
        browser.get(served.url + "login")
        browser.find_element(By.ID, "actor").send_keys("alice")
        browser.find_element(By.ID, "token").send_keys(TOKEN)
        follow(browser, browser.find_element(By.ID, "login-submit"))
        for task_id in odd:
            browser.get(served.url + "tasks?tenant=odd")
            (link,) = [a for a in browser.find_elements(By.CSS_SELECTOR, "a.task-link") if a.text == task_id]
            follow(browser, link)
            assert browser.find_element(By.ID, "task-id").text == task_id, browser.current_url
            pause = browser.find_element(By.ID, "action-pause")
            pause.find_element(By.NAME, "reason").send_keys("odd id")
            follow(browser, pause.find_element(By.CSS_SELECTOR, "button.act-pause"))
            assert "pause: task is" in browser.find_element(By.CLASS_NAME, "flash").text
            assert browser.find_element(By.ID, "task-id").text == task_id
            assert store.get_task(task_id).paused == "paused by alice: odd id"
    finally:
        served.stop()
