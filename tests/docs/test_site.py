"""The documentation site, built as CI builds it and looked at in a real browser (the system
Chromium, headless, through Selenium and Debian's chromedriver): the index, the tutorial
and the reference render with their navigation and their code blocks (checked in the DOM
and in screenshots), and the search page finds a term.

The build is the one .ci/run makes: ``-W`` fails it on any warning, ``-n`` makes every
unresolved reference one. Without Chromium the browser test is skipped, except under
``CI``, where it fails."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
BUILD = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html"]
SECTIONS = ["Tutorial: a workflow that survives a kill", "How-to guides", "Reference", "Explanation"]

# Builds the whole site and drives Chromium: outside the default run, inside the run of
# every test (`pytest -m 'slow or not slow'`, as .ci/run runs it).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    html = tmp_path_factory.mktemp("site") / "html"
    doctrees = html.parent / "doctrees"
    done = subprocess.run(
        [*BUILD, "-d", str(doctrees), str(ROOT / "docs"), str(html)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # not one warning
    return html


@pytest.fixture(scope="module")
def url(site: Path) -> Iterator[str]:
    """The site over HTTP on loopback, as a browser reads a published one (the search
    page loads its index with a script)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def browser() -> Iterator[webdriver.Chrome]:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        message = f"{', '.join(missing)} not installed (Debian: apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, so the browser tests must run")
        pytest.skip(message)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def colours(png: bytes) -> int:
    """How many distinct colours a screenshot holds: a blank or unstyled box has one or
    two, rendered text and highlighted code many (anti-aliasing included)."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return len(image.getcolors(maxcolors=1 << 24) or ())


def navigation(browser: webdriver.Chrome, shots: Path, name: str) -> WebElement:
    """The page's sidebar: shown, holding the four sections, and drawn (not blank)."""
    tree = browser.find_element(By.CSS_SELECTOR, ".sidebar-tree")
    assert tree.is_displayed()
    links = [a.text for a in tree.find_elements(By.CSS_SELECTOR, "a.reference") if a.is_displayed()]
    assert set(SECTIONS) <= set(links), links
    png = tree.screenshot_as_png
    (shots / f"{name}-navigation.png").write_bytes(png)
    assert colours(png) > 20
    return tree


def code_block(browser: webdriver.Chrome, shots: Path, name: str, language: str) -> WebElement:
    """The first ``language`` code block: shown in a box of its own colour, its text
    highlighted (token spans) and drawn in several colours."""
    block = browser.find_element(By.CSS_SELECTOR, f"div.highlight-{language} pre")
    assert block.is_displayed() and block.size["height"] > 20
    assert block.find_elements(By.CSS_SELECTOR, "span[class]"), "no highlighted token"
    page_background = browser.find_element(By.TAG_NAME, "body").value_of_css_property("background-color")
    box = block.find_element(By.XPATH, "..")
    assert box.value_of_css_property("background-color") != page_background
    png = block.screenshot_as_png
    (shots / f"{name}-code.png").write_bytes(png)
    assert colours(png) > 20
    return block


def test_the_index_tutorial_and_reference_render_with_navigation_and_code(
    browser: webdriver.Chrome, url: str, tmp_path: Path
) -> None:
    browser.get(f"{url}/index.html")
    assert browser.title.startswith("runifold_sync")
    navigation(browser, tmp_path, "index")
    browser.save_screenshot(str(tmp_path / "index.png"))
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text.startswith("runifold_sync")

    browser.get(f"{url}/tutorial.html")
    navigation(browser, tmp_path, "tutorial")
    code_block(browser, tmp_path, "tutorial", "python")
    code_block(browser, tmp_path, "tutorial", "console")
    browser.save_screenshot(str(tmp_path / "tutorial.png"))

    browser.get(f"{url}/reference/api.html")
    navigation(browser, tmp_path, "api")
    signature = browser.find_element(By.ID, "runifold_sync.WorkflowWorker")
    assert signature.is_displayed() and "WorkflowWorker" in signature.text
    assert browser.find_elements(By.CSS_SELECTOR, "dl.py.method"), "no method documented"

    browser.get(f"{url}/reference/cli.html")
    navigation(browser, tmp_path, "cli")
    commands = browser.find_elements(By.CSS_SELECTOR, "section[id$='-run'] h3, section[id$='-run'] h4")
    assert any(heading.text.startswith("run") for heading in commands), [h.text for h in commands]
    code_block(browser, tmp_path, "cli", "console")
    browser.save_screenshot(str(tmp_path / "cli.png"))


def test_the_search_page_finds_a_term(browser: webdriver.Chrome, url: str) -> None:
    browser.get(f"{url}/search.html?q=fencing")
    # Results are added one by one; the summary says when the search has finished.
    WebDriverWait(browser, 60).until(
        lambda b: "found" in " ".join(p.text for p in b.find_elements(By.CSS_SELECTOR, "#search-results p"))
    )
    found = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, "#search-results li a")]
    assert any(href and href.endswith("explanation/durability.html") for href in found), found
